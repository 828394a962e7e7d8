"""The command line: a thin layer that parses options, calls the library and writes what it
renders, with one-line errors and stable exit codes."""
