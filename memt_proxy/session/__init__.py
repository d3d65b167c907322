"""The proxy's session layer by floor; ``memt_proxy.sessions`` puts it together (see its docstring)."""
