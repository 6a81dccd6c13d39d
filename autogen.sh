#!/bin/sh
# Regenerate configure and Makefile.in from configure.ac and Makefile.am.
set -e
cd "$(dirname "$0")"
autoreconf --install --force --warnings=no-portability >/dev/null
# Keep the committed TAP driver (autoreconf does not install it).
test -f build-aux/tap-driver.sh
echo "autogen.sh: done; now run ./configure"
