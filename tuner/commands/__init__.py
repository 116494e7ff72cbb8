"""One module per `cgtune` subcommand; each is thin and calls the library."""
