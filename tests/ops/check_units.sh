#!/bin/sh
# The systemd units and what `meson install` puts in place, checked without
# systemd as PID 1 (there is none here): systemd-analyze verify with no
# warning at all (bad values only warn, so stderr must be empty), the
# exposure score of systemd-analyze security --offline=true (reported; it
# must stay "OK", <= 2.5), sysusers.d and tmpfiles.d entries applied to a
# scratch root; `meson install --destdir` as a user who is not root (as
# nobody, in a mount namespace where the build's meson-logs is writable),
# every file under the prefix, and under another prefix (configured only); the installed unit's ExecStart line started
# as systemd starts it (RUNTIME_DIRECTORY, STATE_DIRECTORY,
# CONFIGURATION_DIRECTORY) with no config file and with one; a --config FILE
# that does not exist refused; zerod's and zeroctl's --help (the verbs
# members of --group may run as ctl.c and the README say); Python's
# ZerodError naming its call once; and a trace file that zerod would write
# into a /tmp of its own (PrivateTmp=yes, here a tmpfs in zerod's mount
# namespace) refused. TAP.
#   check_units.sh SOURCE_ROOT BUILD_ROOT
src=$1
build=$2
dir=$(mktemp -d /tmp/zerod-units.XXXXXX)
zpid=
trap '[ -z "$zpid" ] || kill "$zpid" 2>/dev/null; rm -rf "$dir"' EXIT
chmod 755 "$dir"
n=0
fail=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fail=1; echo "not ok $n - $1"; }
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
show() { sed 's/^/# /' "$1"; }
# wait_for FILE: up to 10 s for it to appear
wait_for() {
    i=0
    while [ ! -e "$1" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    [ -e "$1" ]
}
# stop_zerod: SIGTERM, and its exit status in $st
stop_zerod() {
    kill -TERM "$zpid"
    wait "$zpid"
    st=$?
    zpid=
}
echo "1..15"

# the units as they are installed, pointing at this build's binaries
sed -e "s#@ZEROD@#$build/daemon/zerod#" -e "s#@ZEROCTL@#$build/tools/zeroctl#" \
    "$src/systemd/zerod.service.in" >"$dir/zerod.service"
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
    [ "$(stat -c '%a' "$dir/root/var/lib/zerod")" = 750 ] &&
    [ "$(stat -c '%a' "$dir/root/var/lib/zerod/checkpoints")" = 1770 ] &&
    [ "$(stat -c '%g' "$dir/root/var/lib/zerod/checkpoints")" = \
        "$(awk -F: '$1 == "zerod" { print $3 }' "$dir/root/etc/group")" ]; then
    ok "tmpfiles.d: /run/zerod and /var/lib/zerod, mode 0750; the example config's checkpoint-dir writable by the group zerod, sticky (1770)"
else
    notok "tmpfiles.d"; show "$dir/tmpfiles"
fi

# meson install puts the units, the entries and zeroctl in place, all under
# the prefix (or a directory an option names), as a user who is not root
opts=$(meson introspect "$build" --buildoptions | python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
print(o["prefix"], o.get("systemdunitdir") or "-", o.get("sysusersdir") or "-",
      o.get("tmpfilesdir") or "-")')
set -- $opts
prefix=$1
allowed="$prefix $2 $3 $4"
mkdir -p "$dir/inst" "$dir/logs"
as=""
if [ "$(id -u)" = 0 ]; then
    chown nobody "$dir/inst" "$dir/logs"
    # nobody cannot write the build's meson-logs (install-log.txt): a
    # mount namespace of this command alone lends it one
    if unshare -m true 2>/dev/null && command -v setpriv >/dev/null; then
        as="as nobody"
        unshare -m sh -c "mount --bind '$dir/logs' '$build/meson-logs' &&
            exec setpriv --reuid nobody --regid nogroup --clear-groups \
            meson install -C '$build' --no-rebuild --destdir '$dir/inst'" >"$dir/install" 2>&1
    else
        as="as root (no unshare -m here to run it as nobody)"
        meson install -C "$build" --no-rebuild --destdir "$dir/inst" >"$dir/install" 2>&1
    fi
else
    as="as uid $(id -u)"
    meson install -C "$build" --no-rebuild --destdir "$dir/inst" >"$dir/install" 2>&1
fi
st=$?
svc=
if [ $st -eq 0 ]; then
    svc=$(find "$dir/inst" -name zerod.service -path '*systemd/system*' | head -1)
    missing=""
    for f in zerod.socket sbin/zerod bin/zeroctl sysusers.d/zerod.conf tmpfiles.d/zerod.conf \
        zerod/zeroctl.schema.json doc/zerod/zerod.conf.example; do
        find "$dir/inst" -path "*$f" | grep -q . || missing="$missing $f"
    done
    outside=$(cd "$dir/inst" && find . ! -type d | sed 's#^\.##' | while read -r f; do
        in=no
        for a in $allowed; do
            case $a in -) continue ;; esac
            case $f in "$a"/*) in=yes ;; esac
        done
        [ $in = yes ] || echo "$f"
    done | tr '\n' ' ')
    if [ -n "$svc" ] && [ -z "$missing" ] && [ -z "$outside" ] &&
        grep -q '^ExecStart=/.*/sbin/zerod$' "$svc" &&
        grep -q '^ConfigurationDirectory=zerod$' "$svc" &&
        grep -q '^ExecReload=/.*/bin/zeroctl --socket /run/zerod/zerod.sock reload$' "$svc"; then
        ok "meson install --destdir $as: units, entries, zeroctl, its schema, all under $prefix"
    else
        notok "meson install $as: missing:$missing; outside $prefix: $outside; service: ${svc:-none}"
        [ -n "$svc" ] && show "$svc"
    fi
else
    notok "meson install $as: exit $st"; show "$dir/install"
fi

# Another prefix, configured only (a build would take minutes): every file
# `meson install` would copy, as meson lists them, lies under it
meson setup "$dir/pfx-build" "$src" --prefix "$dir/pfx" -Dtests=false -Dgloo=disabled \
    -Dcuda=disabled >"$dir/pfx-setup" 2>&1
st=$?
outside=$(meson introspect "$dir/pfx-build" --installed 2>>"$dir/pfx-setup" | python3 -c '
import json, sys
dests = json.load(sys.stdin).values()
print(len(dests), " ".join(d for d in dests if not d.startswith(sys.argv[1] + "/")))' "$dir/pfx")
set -- $outside
if [ $st -eq 0 ] && [ "${1:-0}" -gt 10 ] && [ $# -eq 1 ]; then
    ok "meson setup --prefix DIR: all $1 files meson install would copy go under DIR"
else
    notok "meson setup --prefix DIR: exit $st; files, then those outside DIR: $outside"
    show "$dir/pfx-setup"
fi

# The installed unit's ExecStart line, as systemd starts it: its
# RuntimeDirectory=, StateDirectory= and ConfigurationDirectory= in the
# environment (here under $dir), no config file there, then one.
start_unit() {
    set -- $(sed -n 's/^ExecStart=//p' "$svc")
    bin=$1
    shift
    rm -rf "$dir/run"
    mkdir -p "$dir/run/zerod" "$dir/state/zerod" "$dir/etc/zerod"
    # a sanitizer's options go through (systemd would pass Environment=)
    env -i PATH=/usr/bin:/bin ${ASAN_OPTIONS:+ASAN_OPTIONS=$ASAN_OPTIONS} \
        ${UBSAN_OPTIONS:+UBSAN_OPTIONS=$UBSAN_OPTIONS} ${TSAN_OPTIONS:+TSAN_OPTIONS=$TSAN_OPTIONS} \
        ${LSAN_OPTIONS:+LSAN_OPTIONS=$LSAN_OPTIONS} RUNTIME_DIRECTORY="$dir/run/zerod" \
        STATE_DIRECTORY="$dir/state/zerod" CONFIGURATION_DIRECTORY="$dir/etc/zerod" \
        "$dir/inst$bin" "$@" 2>"$dir/unit.log" &
    zpid=$!
    wait_for "$dir/run/zerod/zerod.sock.ctl"
}
if [ -z "$svc" ]; then
    skip "the installed unit without a config file" "not installed"
    skip "the installed unit with /etc/zerod/zerod.conf" "not installed"
else
    start_unit
    "$build/tools/zeroctl" --socket "$dir/run/zerod/zerod.sock" status >"$dir/st1" 2>&1
    zst=$?
    stop_zerod
    if [ $zst -eq 0 ] && grep -q 'config (none)' "$dir/st1" &&
        grep -q "no config file ($dir/etc/zerod/zerod.conf does not exist)" "$dir/unit.log" &&
        [ $st -eq 0 ] && [ ! -e "$dir/run/zerod/zerod.sock.lock" ]; then
        ok "the installed unit's ExecStart without a config file: serves, exits 0, no lock file left"
    else
        notok "the installed unit without a config file: zeroctl $zst, zerod exit $st"
        show "$dir/st1"; show "$dir/unit.log"; ls -la "$dir/run/zerod" | show /dev/stdin
    fi
    printf '[zerod]\nstall-warn = 4321\n' >"$dir/etc/zerod/zerod.conf"
    start_unit
    "$build/tools/zeroctl" --socket "$dir/run/zerod/zerod.sock" status >"$dir/st2" 2>&1
    zst=$?
    stop_zerod
    if [ $zst -eq 0 ] && grep -q "config $dir/etc/zerod/zerod.conf" "$dir/st2" &&
        grep -q "config file $dir/etc/zerod/zerod.conf" "$dir/unit.log" && [ $st -eq 0 ]; then
        ok "the installed unit's ExecStart with \$CONFIGURATION_DIRECTORY/zerod.conf: reads it"
    else
        notok "the installed unit with a config file: zeroctl $zst, zerod exit $st"
        show "$dir/st2"; show "$dir/unit.log"
    fi
fi

# a config file named on the command line must be there
"$build/daemon/zerod" --socket "$dir/m.sock" --config "$dir/no-such.conf" >"$dir/miss" 2>&1
st=$?
if [ $st -eq 78 ] && grep -q "$dir/no-such.conf: No such file or directory" "$dir/miss"; then
    ok "--config FILE that does not exist: exit 78, names it"
else
    notok "--config FILE that does not exist: exit $st"; show "$dir/miss"
fi

# the detailed --help of both commands
"$build/daemon/zerod" --help >"$dir/zh" 2>&1
st=$?
miss=""
for k in --config --socket --stall-timeout --stall-warn --join-timeout --hello-timeout \
    --shutdown-timeout --workers --max-jobs --max-sessions --max-memory --log-level \
    --flight-records --metrics-textfile --metrics-interval --group --tls-key --tls-cert \
    --tls-peers --tls-ca --tls-ktls --tls-allow-plain-nccl \
    SIGHUP "Exit status" 78 live restart "zeroctl status" "inspect JOB" "| metrics" \
    "| reload" "trace on FILE" "trace off" "checkpoint JOB" "keygen PREFIX" "fingerprint CERT" \
    CONFIGURATION_DIRECTORY; do
    grep -q -- "$k" "$dir/zh" || miss="$miss '$k'"
done
# no man page is installed: none is named
grep -q 'zeroctl(1)' "$dir/zh" && miss="$miss (names zeroctl(1), which is not installed)"
# what members of --group may run: the same verbs in --help, the README and
# the control socket's table (daemon/ops/ctl.c)
member=$(grep 'ROLE_MEMBER},' "$src/daemon/ops/ctl.c" | sed 's/.*"\([a-z]*\)".*/\1/' | sort | tr '\n' ' ')
grep -q "members of this group may run zeroctl status, inspect, metrics and checkpoint" "$dir/zh" ||
    miss="$miss (--group's verbs)"
grep -q 'may run `status`, `inspect`, `metrics` and `checkpoint`' "$src/README.md" ||
    miss="$miss (the README's verbs for members)"
[ "$member" = "checkpoint inspect metrics status " ] || miss="$miss (ctl.c's member verbs: $member)"
if [ $st -eq 0 ] && [ -z "$miss" ]; then
    ok "zerod --help: every key and verb, signals, exit statuses; members' verbs agree"
else
    notok "zerod --help: exit $st, lacks:$miss"; fi
"$build/tools/zeroctl" --help >"$dir/ch" 2>&1
st=$?
miss=""
for k in status inspect metrics reload "trace on FILE" "trace off" keygen "fingerprint CERT" "-o, --output" schema_version \
    " 0 " " 1 " " 64 " " 69 " " 76 " " 77 "; do
    grep -q -- "$k" "$dir/ch" || miss="$miss '$k'"
done
if [ $st -eq 0 ] && [ -z "$miss" ]; then ok "zeroctl --help: every verb and exit status"; else
    notok "zeroctl --help: exit $st, lacks:$miss"; fi

# zeroctl keygen: an Ed25519 key (0600) and its certificate (0644), which
# OpenSSL reads; the printed fingerprint is the certificate's SHA-256, as
# `zeroctl fingerprint` and `openssl x509` say; a second keygen with the same
# prefix fails naming the file and leaves both files as they were; no .pub
kg="$dir/kg"
zctl="$build/tools/zeroctl"
fp=$("$zctl" keygen "$kg" 2>"$dir/kg.err"); st=$?
ossl=$(openssl x509 -in "$kg.crt" -noout -fingerprint -sha256 2>/dev/null | sed 's/.*=//; s/://g' | tr 'A-F' 'a-f')
sum=$(sha256sum "$kg.key" "$kg.crt" 2>/dev/null)
"$zctl" keygen "$kg" >"$dir/kg2.out" 2>"$dir/kg2.err"; st2=$?
"$zctl" fingerprint "$dir/kg.err" >/dev/null 2>"$dir/kg3.err"; st3=$?
"$zctl" fingerprint >/dev/null 2>&1; st4=$?
miss=""
[ $st -eq 0 ] || miss="$miss (keygen exit $st)"
[ -f "$kg.key" ] && [ -f "$kg.crt" ] && [ ! -e "$kg.pub" ] || miss="$miss (files: not .key and .crt alone)"
[ "$(stat -c %a "$kg.key" 2>/dev/null)" = 600 ] || miss="$miss (key mode $(stat -c %a "$kg.key" 2>/dev/null))"
[ "$(stat -c %a "$kg.crt" 2>/dev/null)" = 644 ] || miss="$miss (certificate mode $(stat -c %a "$kg.crt" 2>/dev/null))"
openssl pkey -in "$kg.key" -noout 2>/dev/null || miss="$miss (openssl pkey refuses the key)"
openssl x509 -in "$kg.crt" -noout 2>/dev/null || miss="$miss (openssl x509 refuses the certificate)"
printf '%s\n' "$fp" | grep -qx '[0-9a-f]\{64\}' && [ "$fp" = "$ossl" ] ||
    miss="$miss (fingerprint '$fp', openssl's '$ossl')"
[ "$("$zctl" fingerprint "$kg.crt" 2>&1)" = "$fp" ] || miss="$miss (zeroctl fingerprint differs)"
[ $st2 -eq 1 ] && [ ! -s "$dir/kg2.out" ] &&
    grep -qx "zeroctl: keygen: $kg.key: File exists" "$dir/kg2.err" &&
    [ "$(sha256sum "$kg.key" "$kg.crt" 2>/dev/null)" = "$sum" ] ||
    miss="$miss (second keygen: exit $st2, files changed or message)"
[ $st3 -eq 1 ] && grep -q "zeroctl: fingerprint: $dir/kg.err: " "$dir/kg3.err" ||
    miss="$miss (fingerprint of a non-certificate: exit $st3)"
[ $st4 -eq 64 ] || miss="$miss (fingerprint without CERT: exit $st4)"
if [ -z "$miss" ]; then
    ok "zeroctl keygen: key 0600 and certificate OpenSSL reads, its fingerprint; never over a file"
else
    notok "zeroctl keygen:$miss"; show "$dir/kg.err"; show "$dir/kg2.err"; show "$dir/kg3.err"
fi

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
# Python's ZerodError names the call once, also when the library's reason
# begins with it ("zc_restore: ZC_ECKPT (-1030): zc_restore: ..." was said)
if [ -n "${ASAN_OPTIONS:-}${TSAN_OPTIONS:-}" ]; then
    # python3 cannot load a sanitized libzeroclient (the runtime must come first)
    skip "ZerodError names the call once" "a sanitized build: python3 cannot load its libzeroclient (the plain build checks it)"
elif msg=$(PYTHONPATH="$src/client/python" ZEROD_LIBZEROCLIENT="$build/client/libzeroclient.so.1" \
    python3 -c 'from zerod import ZerodError
print(ZerodError("zc_restore", -1030, "zc_restore: /x: no checkpoint"))' 2>&1) &&
    [ "$msg" = "zc_restore: ZC_ECKPT (-1030): /x: no checkpoint" ]; then
    ok "ZerodError names the call once: $msg"
else
    notok "ZerodError: '$msg'"
fi

# A trace into a /tmp that is zerod's own (zerod.service's PrivateTmp=yes;
# here a tmpfs over $dir/priv in zerod's mount namespace) is refused and
# stopped; a relative FILE is the caller's, resolved from its directory.
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
    skip "a trace zerod would write where the caller does not see it" \
        "needs root and unshare -m (a mount namespace for zerod)"
else
    mkdir -p "$dir/priv" "$dir/pub"
    unshare -m sh -c "mount -t tmpfs tmpfs '$dir/priv' &&
        exec '$build/daemon/zerod' --socket '$dir/t.sock' --config /dev/null" 2>"$dir/t.log" &
    zpid=$!
    wait_for "$dir/t.sock.ctl"
    zc="$build/tools/zeroctl --socket $dir/t.sock"
    $zc trace on "$dir/priv/x.json" >"$dir/tr1" 2>&1
    st1=$?
    $zc status >"$dir/tr2" 2>&1
    (cd "$dir/pub" && $zc trace on rel.json) >"$dir/tr3" 2>&1
    st3=$?
    $zc trace off >>"$dir/tr3" 2>&1
    stop_zerod
    if [ $st1 -eq 1 ] && grep -q "PrivateTmp=yes" "$dir/tr1" && grep -q "trace: off" "$dir/tr2" &&
        [ ! -e "$dir/priv/x.json" ] && [ $st3 -eq 0 ] && grep -q "tracing to $dir/pub/rel.json" "$dir/tr3" &&
        python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$dir/pub/rel.json"; then
        ok "trace on FILE: refused where the caller does not see it; a relative FILE is the caller's"
    else
        notok "trace on FILE: exit $st1 into zerod's own /tmp, $st3 relative"
        show "$dir/tr1"; show "$dir/tr2"; show "$dir/tr3"; show "$dir/t.log"
    fi
fi
exit $fail
