"""TLS for kvferry's servers and for the router's calls to its nodes (docs/router.md, docs/kubernetes.md).

files.py: the certificate flags every server takes; watch.py: whether mounted files changed; server.py: uvicorn
serving HTTPS and taking a rotated certificate without a restart; client.py: the router's trust in its nodes.
"""
