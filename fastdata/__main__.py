import sys

try:
    from fastdata.cli import main
except KeyboardInterrupt:  # Ctrl-C while the CLI itself is still being imported: the same one line as later
    sys.stderr.write("fastdata: interrupted\n")
    sys.exit(130)

sys.exit(main())
