"""The files the chat page (chat_page.py) loads, under /chat-ui/: declared once, here, for the route
that serves them and for the HTTP guard that lets a browser fetch them without a key. A module of its
own so that the guard, in every edge process, does not import the page's router to learn them."""
ASSETS = ("chat.js", "chat-store.js", "chat-settings.js", "vendor/marked.umd.js", "vendor/purify.min.js",
          "vendor/highlight.min.js", "vendor/github.min.css", "vendor/github-dark.min.css")
