"""The HTTP shell: the FastAPI app and its routes over the surfaces, request inputs, metrics, the cluster's routes
and the embedded core."""
