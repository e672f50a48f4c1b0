"""The HTTP surface: app factory, routes, the wire contract, the Origin/Host guard, the
bearer token and the MCP endpoint. Routes validate, call the engine and serialize; they
hold no search or index logic."""
