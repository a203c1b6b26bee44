"""The router's discovery stage: where the nodes are, what their records say, and whether they are healthy;
joined into the NodeView snapshots the scheduler reads."""
