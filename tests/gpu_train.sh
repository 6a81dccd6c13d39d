#!/bin/sh
. "$DT_SRCDIR/tests/tap.sh"
skip_all "stub"
