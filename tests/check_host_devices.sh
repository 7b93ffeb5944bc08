#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs after every other test (ctest FIXTURES_CLEANUP): the suite must leave
# the machine's shared device files as it found them.  An output written
# over /dev/null once turned it into a regular file for the whole host.
rc=0
for dev in null:1:3 full:1:7 zero:1:5; do
  name=${dev%%:*}; want=${dev#*:}
  got=$(stat -c '%F %t:%T' "/dev/$name" 2>&1)
  major=$(printf '%d' "0x$(echo "$got" | sed -n 's/^character special file \([0-9a-f]*\):.*/\1/p')" 2>/dev/null)
  minor=$(printf '%d' "0x$(echo "$got" | sed -n 's/^character special file [0-9a-f]*:\([0-9a-f]*\)$/\1/p')" 2>/dev/null)
  if [ "$major:$minor" != "$want" ]; then
    echo "FAIL: /dev/$name is no longer the character device $want: $got"
    rc=1
  else
    echo "ok: /dev/$name is the character device $want"
  fi
done
exit $rc
