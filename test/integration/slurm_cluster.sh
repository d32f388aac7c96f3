#!/usr/bin/env bash
# Sourced by the real-Slurm tests (slurm_replay.sh, slurm_health.sh): Debian's slurm-wlm 22.05 on
# loopback in a temporary directory, all of it stopped when the test exits. Munge with a key made
# here, slurmctld and four slurmd (node1-node4, four "a100" GPUs each, backed by plain files);
# with slurm_accounting=1 also MariaDB and slurmdbd. Before sourcing, set:
#   slurm_test      the test's name, for messages
#   slurm_accounting 1: start MariaDB and slurmdbd (sacct works); 0: no accounting
#   slurm_conf_extra lines appended to slurm.conf (optional)
# then call slurm_start. It sets dir (the temporary directory), SLURM_CONF, and the helpers
# free_port and wait_for. Exits 77 (skipped) without Slurm or root, unless
# GPUFLEET_REQUIRE_SLURM=1 makes that a failure.

slurm_skip() {
  echo "$slurm_test: $1"
  [ "${GPUFLEET_REQUIRE_SLURM:-0}" = 1 ] && exit 1
  exit 77
}

tools=(slurmctld slurmd munged scontrol sinfo sbatch python3)
if [ "${slurm_accounting:-0}" = 1 ]; then
  tools+=(slurmdbd mariadbd mariadb-install-db sacct sacctmgr)
fi
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || slurm_skip "$tool missing (scripts/setup --slurm installs it)"
done
[ "$(id -u)" -eq 0 ] || slurm_skip "needs root (slurmd)"

dir=$(mktemp -d /tmp/gpufleet-slurm.XXXXXX)
pids=()
slurm_cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [ "$status" -ne 0 ]; then
    for log in "$dir"/*.log; do
      echo "=== $log"; tail -n 20 "$log" || true
    done
  fi
  rm -rf "$dir"
}
trap slurm_cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_for() {  # wait_for SECONDS COMMAND...: polls until the command succeeds
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "$slurm_test: timed out waiting for: $*"; return 1
    fi
    sleep 0.5
  done
}

slurm_start() {
  # munge, with a key of our own.
  mkdir -p "$dir/munge"
  chmod 755 "$dir" "$dir/munge"
  head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chmod 400 "$dir/munge/munge.key"
  munge_socket="$dir/munge/munge.socket"
  munged --force --key-file="$dir/munge/munge.key" --socket="$munge_socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"
  wait_for 20 test -S "$munge_socket"
  pids+=("$(cat "$dir/munge/munged.pid")")

  local accounting=""
  if [ "${slurm_accounting:-0}" = 1 ]; then
    # MariaDB on a loopback port, a user for slurmdbd.
    local db_port dbd_port
    db_port=$(free_port)
    mariadb-install-db --no-defaults --datadir="$dir/db" --user=root \
      --auth-root-authentication-method=socket >"$dir/mariadb-install.log" 2>&1
    mariadbd --no-defaults --datadir="$dir/db" --user=root --bind-address=127.0.0.1 \
      --port="$db_port" --socket="$dir/mysql.sock" --pid-file="$dir/mariadb.pid" \
      --log-error="$dir/mariadb.log" &
    pids+=("$!")
    wait_for 60 mariadb --no-defaults -S "$dir/mysql.sock" -uroot -e "SELECT 1"
    mariadb --no-defaults -S "$dir/mysql.sock" -uroot -e \
      "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'gpufleet'; GRANT ALL ON *.* TO 'slurm'@'127.0.0.1';"
    dbd_port=$(free_port)
    mkdir -p "$dir/etc"
    cat >"$dir/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$munge_socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=root
PidFile=$dir/slurmdbd.pid
LogFile=$dir/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=gpufleet
StorageLoc=gpufleet_acct
EOF
    chmod 600 "$dir/etc/slurmdbd.conf"
    accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$dbd_port
AccountingStoragePass=$munge_socket
AccountingStorageTRES=gres/gpu,gres/gpu:a100"
  fi

  local ctld_port
  ctld_port=$(free_port)
  mkdir -p "$dir/etc" "$dir/state" "$dir/spool"
  for gpu in 0 1 2 3; do : >"$dir/gpu$gpu"; done
  cat >"$dir/etc/slurm.conf" <<EOF
ClusterName=gpufleet
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
AuthType=auth/munge
AuthInfo=socket=$munge_socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
$accounting
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
KillWait=2
OverTimeLimit=0
MinJobAge=2
SlurmdParameters=config_overrides
${slurm_conf_extra:-}
EOF
  local node port
  for node in 1 2 3 4; do
    port=$(free_port)
    echo "NodeName=node$node NodeHostname=localhost NodeAddr=127.0.0.1 Port=$port CPUs=4 RealMemory=4000 Gres=gpu:a100:4" \
      >>"$dir/etc/slurm.conf"
  done
  echo "PartitionName=gpu Nodes=node[1-4] Default=YES MaxTime=INFINITE State=UP" >>"$dir/etc/slurm.conf"
  echo "NodeName=node[1-4] Name=gpu Type=a100 File=$dir/gpu[0-3]" >"$dir/etc/gres.conf"
  export SLURM_CONF="$dir/etc/slurm.conf"

  if [ "${slurm_accounting:-0}" = 1 ]; then
    slurmdbd -D >"$dir/slurmdbd.out.log" 2>&1 &
    pids+=("$!")
    wait_for 60 grep -q "slurmdbd version .* started" "$dir/slurmdbd.log"
    sacctmgr -i add cluster gpufleet >/dev/null
  fi
  slurmctld -D -i >"$dir/slurmctld.out.log" 2>&1 &
  pids+=("$!")
  wait_for 60 scontrol ping
  for node in 1 2 3 4; do
    slurmd -D -N "node$node" >"$dir/slurmd.node$node.out.log" 2>&1 &
    pids+=("$!")
  done
  wait_for 60 bash -c '[ "$(sinfo -h -N -o %N | sort -u | wc -l)" -eq 4 ] && [ -z "$(sinfo -h -N -t unknown,down,not_responding -o %N)" ]'
}
