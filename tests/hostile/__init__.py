"""A hostile test server (not a stand-in for SGLang): answers that break the client on purpose."""
