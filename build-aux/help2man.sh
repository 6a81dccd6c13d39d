#!/bin/sh
# help2man.sh PROGRAM NAME DESCRIPTION [COMMAND...]: a man page (section 1) from a
# program's --help, and for each COMMAND from `PROGRAM COMMAND --help`, so the page says
# what the program itself says (dtrain train's help comes from the option rows of
# src/options.c). The help text is kept as it is, line for line (no-fill), under the
# headings of its own "Heading:" lines; tests/man.sh renders every page with man -l
# and checks that every flag of --help is in it.
set -eu
prog=$1 name=$2 desc=$3
shift 3
upper=$(printf '%s' "$name" | tr '[:lower:]' '[:upper:]')
# roff-safe text: backslashes doubled, a leading . or ' made literal
esc() { sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }
# one help text as no-fill blocks, each "Heading:" line (column 0, ending with ':')
# a subsection of its own
block() {
    printf '.nf\n'
    esc | awk '/^[A-Za-z][^ ].*:$/ && !/^usage:/ { print ".fi"; print ".SS \"" substr($0, 1, length($0) - 1) "\""; print ".nf"; next } { print }'
    printf '.fi\n'
}
printf '.TH %s 1 "" "dtrain" "User Commands"\n' "$upper"
printf '.SH NAME\n%s \\- %s\n' "$name" "$desc"
printf '.SH SYNOPSIS\n'
"$prog" --help 2>&1 | sed -n 's/^usage: *//p' | head -n 1 | esc | sed 's/^/.B /'
printf '.SH DESCRIPTION\n'
"$prog" --help 2>&1 | block
for cmd in "$@"; do
    printf '.SH "%s %s"\n' "$name" "$cmd"
    "$prog" "$cmd" --help 2>&1 | block
done
printf '.SH "SEE ALSO"\n'
printf 'dtrain(1), dtrun(1), dtbench(1); docs/ in the source tree (docs/DESIGN.md: the design).\n'
