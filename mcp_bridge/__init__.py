"""`qmd mcp`: the stdio MCP bridge to the daemon's `/mcp` endpoint.

Every MCP client shares the one warm daemon; this process only forwards
JSON-RPC, so it loads no model, opens no database and starts in a blink.
"""
