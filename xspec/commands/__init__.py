"""One module per `xspec` subcommand: NAME, HELP, DESCRIPTION, add_arguments(parser), run(args)."""
