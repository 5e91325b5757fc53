"use strict";
// The chat page's conversations as this browser keeps them (chat.js, the rest of the page, loads
// after this file): one IndexedDB store of conversations, and each conversation's messages as a
// tree. An edit or a regeneration adds a sibling; `leaf` is the end of the branch shown.

// ----- storage: one IndexedDB store of conversations -----
let database = null;  // chat.js's start() opens it
function openDatabase() {
  return new Promise((resolve, reject) => {
    const request = indexedDB.open("llm-stream-chat", 1);
    request.onupgradeneeded = () => request.result.createObjectStore("conversations", { keyPath: "id" });
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}
function store(mode, work) {
  return new Promise((resolve, reject) => {
    const t = database.transaction("conversations", mode), request = work(t.objectStore("conversations"));
    t.oncomplete = () => resolve(request.result);
    t.onerror = () => reject(t.error);
  });
}

// ----- a conversation: messages in a tree, `leaf` the end of the branch shown -----
const uid = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 10);
const newConversation = () => ({ id: uid(), title: "New chat", updated: Date.now(), nodes: {}, roots: [], leaf: null });

function addNode(conv, parent, role, content) {
  const node = { id: uid(), parent, role, content, reasoning: "", meta: null, error: null, children: [] };
  conv.nodes[node.id] = node;
  (parent ? conv.nodes[parent].children : conv.roots).push(node.id);
  conv.leaf = node.id;
  return node;
}
function chain(conv, id) {  // the messages from the first to `id`
  const out = [];
  for (; id; id = conv.nodes[id].parent) out.unshift(conv.nodes[id]);
  return out;
}
const siblings = (conv, node) => (node.parent ? conv.nodes[node.parent].children : conv.roots);
function deepest(conv, id) {
  let node = conv.nodes[id];
  while (node.children.length) node = conv.nodes[node.children[node.children.length - 1]];
  return node.id;
}
