#!/bin/sh
# Adds the WebCodex Server to Claude Code over Streamable HTTP with a bearer header.
# The token is expanded now and stored in Claude Code's config; rotate it with
# `webcodex-server token revoke` + `token issue` when needed.
claude mcp add --transport http webcodex "${WEBCODEX_URL:-http://127.0.0.1:7420/mcp}" \
  --header "Authorization: Bearer ${WEBCODEX_TOKEN:?set WEBCODEX_TOKEN first}"
