# The single writer (writer.py): the jobs it takes (jobs.py), the thread that makes
# its blocking calls (writer_thread.py), when the garbage collector may run
# (collector.py), and the expiry sweep it commits (sweeper.py).
