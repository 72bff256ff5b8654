"""SGLang's own server and a client of its protocol, shared by the stages that start it (serve, perf): one
server's life in its own process group (server.py), and the streaming load client (client.py). Not a stage."""
