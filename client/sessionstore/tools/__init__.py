# The command-line tools: `sessionstore` (cli.py), the importer of
# a3s-code-core stores, and the generated shell completion and man pages.
