"""The gateway (runs in the server process): HTTP in, binary frames out to the instances."""
