"""One accord node assembled from the layers below: server, KV backend, member changes,
the gRPC server, configuration and the local dev cluster."""
