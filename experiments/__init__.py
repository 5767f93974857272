"""Studies that use the HOPS library."""
