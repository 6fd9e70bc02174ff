# Sourced by scripts/*: apt_install PACKAGE... installs Debian packages (as root), trying the
# package lists as they are first and after an `apt-get update`; a failure ends the run with
# the tail of its log. The packages are named by the caller, which checks what is missing.
apt_install() {
  printf '== installing %s (apt)\n' "$*" >&2
  if [ "$(id -u)" != 0 ]; then echo "error: installing $* needs root (or install them yourself)" >&2; exit 1; fi
  local t log=/tmp/blackboard-apt.log
  t=$(date +%s)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >"$log" 2>&1 || {
    DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >>"$log" 2>&1; } || {
    tail -20 "$log" >&2; echo "error: could not install $*" >&2; exit 1; }
  printf '== installed in %s s\n' "$(( $(date +%s) - t ))" >&2
}
