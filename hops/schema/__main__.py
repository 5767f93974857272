"""`python -m hops.schema` rewrites hops/schema/scenario.schema.json from the models;
`--check` exits 1 when the shipped file is out of date (a test runs it)."""
from __future__ import annotations

import sys

from hops.schema import SCHEMA_FILE, schema_text


def main(argv: list[str]) -> int:
    text = schema_text()
    if "--check" in argv:
        if not SCHEMA_FILE.is_file() or SCHEMA_FILE.read_text() != text:
            print(f"{SCHEMA_FILE} is out of date: run python -m hops.schema", file=sys.stderr)
            return 1
        return 0
    SCHEMA_FILE.write_text(text)
    print(SCHEMA_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
