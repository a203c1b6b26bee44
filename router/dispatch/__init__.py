"""The router's dispatch stage: the P/D flow of a scheduled request and the calls to the nodes."""
