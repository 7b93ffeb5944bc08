#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# ctest's first and last tests (FIXTURES_SETUP / FIXTURES_CLEANUP): the suite
# must leave no process of the host stopped (state T), as a daemon or a
# session that stopped a process at a new library and never resumed it would.
#   check_no_stopped.sh record FILE   the processes stopped before the suite
#   check_no_stopped.sh check FILE    fails naming each one stopped since
set -u
mode=${1:?record or check}; file=${2:?file}

# "PID COMM" of each process in state T now (not t: a debugger's stop).
# One cat and one awk for all of /proc: the comm may hold spaces and ')'.
stopped() {
  cat /proc/[0-9]*/stat 2>/dev/null | awk '{
    rest = $0; sub(/.*\) /, "", rest)
    if (substr(rest, 1, 1) != "T") next
    comm = $0; sub(/^[0-9]+ \(/, "", comm); sub(/\) [^)]*$/, "", comm)
    print $1, comm }'
}

if [ "$mode" = record ]; then
  stopped > "$file"
  echo "ok: $(wc -l < "$file") process(es) stopped before the suite (not held against it)"
  exit 0
fi
# A guard resumes what a dying daemon stopped within ~10 s of its end.
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
  new=$(stopped | while read -r pid comm; do
    grep -q "^$pid " "$file" 2>/dev/null || echo "$pid $comm"
  done)
  [ -z "$new" ] && { echo "ok: the suite left no process stopped (state T)"; exit 0; }
  sleep 1
done
echo "FAIL: processes left stopped (state T) by the suite:"
printf '%s\n' "$new" | while read -r pid comm; do
  echo "  pid $pid ($comm): $(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null | cut -c1-200)"
done
exit 1
