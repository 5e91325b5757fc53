#!/usr/bin/env node
// Streams tokens from llm-stream's gRPC port, from Node.js: Jina's stream_doc with a
// PromptDocument, over the protos in ../../proto. Tokens go to stdout as they arrive, a
// summary line to stderr.
//
//   node stream.js [--host H] [--port P] [--max-tokens N] [--seed S] [--chat] [--api-key K]
//                  [--json-schema FILE | --regex R | --choice C (repeatable)] "prompt"
//   node stream.js --document '{"prompt": {"text": "hi"}}' [--endpoint /stream]  # any NodeProto map
//
// Exit status: 0 done, 2 refused with a gRPC status (printed as CODE: details), 3 failed mid-stream.
"use strict";
const fs = require("fs");
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTO_DIR = path.join(__dirname, "..", "..", "proto");
const definition = protoLoader.loadSync(path.join(PROTO_DIR, "jina.proto"), {
  includeDirs: [PROTO_DIR], keepCase: true, longs: String, defaults: false, oneofs: true,
});
const jina = grpc.loadPackageDefinition(definition).jina;

function parseArgs(argv) {
  const args = { host: "localhost", port: 12345, endpoint: "/stream", fields: {} };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const next = () => argv[++i];
    if (arg === "--host") args.host = next();
    else if (arg === "--port") args.port = Number(next());
    else if (arg === "--endpoint") args.endpoint = next();
    else if (arg === "--document") args.document = JSON.parse(next());
    else if (arg === "--max-tokens") args.fields.max_tokens = { integer: Number(next()) };
    else if (arg === "--seed") args.fields.seed = { text: next() }; // 64-bit: decimal text
    else if (arg === "--do-sample") args.fields.do_sample = { boolean: true };
    // structured output: text fields, and the choices a list of text
    else if (arg === "--json-schema") args.fields.json_schema = { text: fs.readFileSync(next(), "utf8") };
    else if (arg === "--regex") args.fields.regex = { text: next() };
    else if (arg === "--choice") {
      args.fields.choice = args.fields.choice || { list: { data: [] } };
      args.fields.choice.list.data.push({ text: next() });
    }
    else if (arg === "--chat") args.chat = true;
    else if (arg === "--api-key") args.apiKey = next();
    else args.prompt = arg;
  }
  return args;
}

// A PromptDocument as DocArray's protobuf: each field one NodeProto (text, integer, float, boolean, list)
function promptDocument(args) {
  if (args.document) return { data: args.document };
  const text = args.chat
    ? { messages: { text: JSON.stringify([{ role: "user", content: args.prompt }]) } }
    : { prompt: { text: args.prompt } };
  return { data: { ...text, ...args.fields } };
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const client = new jina.JinaSingleDocumentRequestRPC(`${args.host}:${args.port}`, grpc.credentials.createInsecure());
  const request = { header: { exec_endpoint: args.endpoint, request_id: `node-${process.pid}` }, document: promptDocument(args) };
  const metadata = new grpc.Metadata();
  const apiKey = args.apiKey || process.env.LLM_API_KEY;
  if (apiKey) metadata.set("authorization", `Bearer ${apiKey}`);
  const call = client.stream_doc(request, metadata);
  let last = null;
  call.on("data", (response) => {
    const doc = response.document.data;
    if (doc.error && doc.error.text) {
      process.stderr.write(`\nerror (${doc.error_type.text}): ${doc.error.text}\n`);
      process.exitCode = 3;
      return;
    }
    process.stdout.write(doc.text ? doc.text.text : "");
    last = doc;
  });
  call.on("error", (err) => {
    process.stderr.write(`${grpc.status[err.code]}: ${err.details}\n`);
    process.exitCode = 2;
  });
  call.on("end", () => {
    if (process.exitCode || !last) return;
    process.stdout.write("\n");
    const field = (name, kind) => (last[name] && last[name][kind] !== undefined ? last[name][kind] : null);
    process.stderr.write(`[finish_reason=${field("finish_reason", "text")} generated_tokens=` +
      `${field("generated_tokens", "integer")} seed=${field("seed", "text")}]\n`);
  });
}

main();
