# The connections: the listener and one task per connection (server.py), its socket
# (socket_io.py), woken through one epoll set for all of them (readiness.py), and its
# replies in order (outbox.py), who may connect (access.py),
# the watchers (watch.py) and the metrics endpoint (metrics.py).
