"""The command line's commands, one module each; ``cosparse.cli`` composes their parsers."""
