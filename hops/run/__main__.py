"""`python -m hops.run`."""
from hops.run.app import main

main()
