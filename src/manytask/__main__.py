"""`python -m manytask`: the same command line as `manytask`."""

from manytask.cli import main

main()
