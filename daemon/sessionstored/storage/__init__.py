# The storage engine: plain Python, no trio (tests/test_layering.py checks), every
# data-file syscall through fs.FileSystem.
