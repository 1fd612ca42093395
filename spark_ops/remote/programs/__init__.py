"""The sh programs spark-ops runs on the nodes, one module per concern, each a RemoteProgram."""
