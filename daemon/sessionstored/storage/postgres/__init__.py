# The PostgreSQL engine: the same documents, history and lease in tables, for
# daemons on many hosts sharing one database.
