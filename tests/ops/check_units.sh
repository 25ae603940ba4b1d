#!/bin/sh
# The systemd units and what `meson install` puts in place, checked without
# systemd as PID 1 (there is none here): systemd-analyze verify with no
# warning at all (bad values only warn, so stderr must be empty), the
# exposure score of systemd-analyze security --offline=true (reported; it
# must stay "OK", <= 2.5), sysusers.d and tmpfiles.d entries applied to a
# scratch root, the installed files, and zerod's and zeroctl's --help. TAP.
#   check_units.sh SOURCE_ROOT BUILD_ROOT
src=$1
build=$2
dir=$(mktemp -d /tmp/zerod-units.XXXXXX)
trap 'rm -rf "$dir"' EXIT
n=0
fail=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fail=1; echo "not ok $n - $1"; }
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
show() { sed 's/^/# /' "$1"; }

echo "1..8"

# the units as they are installed, pointing at this build's binaries
sed -e "s#@ZEROD@#$build/daemon/zerod#" -e "s#@ZEROCTL@#$build/tools/zeroctl#" \
    -e "s#@CONFIG@#/etc/zerod/zerod.conf#" "$src/systemd/zerod.service.in" >"$dir/zerod.service"
cp "$src/systemd/zerod.socket" "$dir/"

if ! command -v systemd-analyze >/dev/null; then
    skip "systemd-analyze verify" "no systemd-analyze (Debian's systemd package)"
    skip "systemd-analyze security" "no systemd-analyze"
else
    systemd-analyze verify --man=no "$dir/zerod.service" "$dir/zerod.socket" >"$dir/verify" 2>&1
    st=$?
    if [ $st -eq 0 ] && [ ! -s "$dir/verify" ]; then ok "systemd-analyze verify: no warnings"; else
        notok "systemd-analyze verify: exit $st"; show "$dir/verify"; fi
    systemd-analyze security --offline=true --no-pager "$dir/zerod.service" >"$dir/sec" 2>&1
    score=$(sed -n 's/.*Overall exposure level for zerod.service: \([0-9.]*\) \([A-Z]*\).*/\1 \2/p' "$dir/sec")
    echo "# systemd-analyze security --offline=true zerod.service: $score"
    case $score in
    [0-1].*" OK" | 2.[0-5]" OK") ok "systemd-analyze security: exposure $score" ;;
    *) notok "systemd-analyze security: exposure '$score' (want OK, <= 2.5)"; show "$dir/sec" ;;
    esac
fi

# sysusers.d and tmpfiles.d, applied to a scratch root
mkdir -p "$dir/root/etc"
if systemd-sysusers --root="$dir/root" "$src/systemd/zerod.sysusers" >"$dir/sysusers" 2>&1 &&
    grep -q '^zerod:x:[0-9]*:[0-9]*:zerod optimizer daemon:/var/lib/zerod:' "$dir/root/etc/passwd" &&
    grep -q '^zerod:x:' "$dir/root/etc/group"; then
    ok "sysusers.d: a system user and group zerod"
else
    notok "sysusers.d"; show "$dir/sysusers"; show "$dir/root/etc/passwd"
fi
if systemd-tmpfiles --root="$dir/root" --create "$src/systemd/zerod.tmpfiles" >"$dir/tmpfiles" 2>&1 &&
    [ "$(stat -c '%a' "$dir/root/run/zerod")" = 750 ] &&
    [ "$(stat -c '%a' "$dir/root/var/lib/zerod")" = 750 ]; then
    ok "tmpfiles.d: /run/zerod and /var/lib/zerod, mode 0750"
else
    notok "tmpfiles.d"; show "$dir/tmpfiles"
fi

# meson install puts the units, the entries and zeroctl in place
if meson install -C "$build" --no-rebuild --destdir "$dir/inst" >"$dir/install" 2>&1; then
    svc=$(find "$dir/inst" -name zerod.service -path '*systemd/system*' | head -1)
    missing=""
    for f in zerod.socket sbin/zerod bin/zeroctl sysusers.d/zerod.conf tmpfiles.d/zerod.conf \
        zerod/zeroctl.schema.json doc/zerod/zerod.conf.example; do
        find "$dir/inst" -path "*$f" | grep -q . || missing="$missing $f"
    done
    if [ -n "$svc" ] && [ -z "$missing" ] && grep -q '^ExecStart=/.*/sbin/zerod --config /' "$svc" &&
        grep -q '^ExecReload=/.*/bin/zeroctl --socket /run/zerod/zerod.sock reload$' "$svc"; then
        ok "meson install: units, sysusers.d, tmpfiles.d, zeroctl, its schema"
    else
        notok "meson install: missing:$missing; service: ${svc:-none}"; [ -n "$svc" ] && show "$svc"
    fi
else
    notok "meson install"; show "$dir/install"
fi

# the detailed --help of both commands
"$build/daemon/zerod" --help >"$dir/zh" 2>&1
st=$?
miss=""
for k in --config --socket --stall-timeout --stall-warn --join-timeout --hello-timeout \
    --shutdown-timeout --workers --max-jobs --max-sessions --max-memory --log-level \
    --flight-records --metrics-textfile --metrics-interval --group --curve-secret-key --curve-peers \
    --curve-allow-plain-nccl \
    SIGHUP "Exit status" 78 live restart; do
    grep -q -- "$k" "$dir/zh" || miss="$miss $k"
done
if [ $st -eq 0 ] && [ -z "$miss" ]; then ok "zerod --help: every key, signals, exit statuses"; else
    notok "zerod --help: exit $st, lacks:$miss"; fi
"$build/tools/zeroctl" --help >"$dir/ch" 2>&1
st=$?
miss=""
for k in status inspect metrics reload "trace on FILE" "trace off" keygen "-o, --output" schema_version \
    " 0 " " 1 " " 64 " " 69 " " 76 " " 77 "; do
    grep -q -- "$k" "$dir/ch" || miss="$miss '$k'"
done
if [ $st -eq 0 ] && [ -z "$miss" ]; then ok "zeroctl --help: every verb and exit status"; else
    notok "zeroctl --help: exit $st, lacks:$miss"; fi

# a bad config file: zerod refuses to start and names the file, line and key
printf '# zerod\n[zerod]\nmax-jobs = 4\nstall-timeout = soon\n' >"$dir/bad.conf"
"$build/daemon/zerod" --socket "$dir/s.sock" --config "$dir/bad.conf" >"$dir/bad" 2>&1
st=$?
if [ $st -eq 78 ] && grep -q "$dir/bad.conf:4: key stall-timeout: 'soon'" "$dir/bad" &&
    [ ! -e "$dir/s.sock" ]; then
    ok "a bad config file: exit 78, names file, line and key"
else
    notok "a bad config file: exit $st"; show "$dir/bad"
fi
exit $fail
