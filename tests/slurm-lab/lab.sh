#!/usr/bin/env bash
# A real SLURM cluster on one Debian machine, for tests and for trying the
# SLURM profile by hand. Needs root.
#
#   tests/slurm-lab/lab.sh up [NODES [FAULT_NODES]]
#                                         start it: NODES compute nodes (default 2) in
#                                         partition lab, FAULT_NODES more (default 0) in
#                                         partition faults, for losing nodes beside the
#                                         jobs of partition lab
#   tests/slurm-lab/lab.sh down           stop everything it started, remove its network
#   tests/slurm-lab/lab.sh status
#   tests/slurm-lab/lab.sh kill-node I    every process of node I dies (a crash); I or nodeI
#   tests/slurm-lab/lab.sh revive-node I  start node I's slurmd again
#   tests/slurm-lab/lab.sh reboot-node I    node I crashes, and is back once SLURM has it down
#
# What it builds:
# - munged, MariaDB, slurmdbd (accounting: `sacct` works, as on real clusters),
#   slurmctld on this machine;
# - one compute node per network namespace (node1..nodeN), each with its own
#   address on a private bridge (10.99.0.0/24, inside this machine only) and
#   its own host name, running its own slurmd; so Horovod's and TensorFlow's
#   traffic between ranks really crosses between "hosts";
# - a second, slower network, as a cluster has Ethernet beside InfiniBand:
#   a second bridge (10.98.0.0/24) and a second interface, eth1, in every
#   node, shaped to SHAPED_RATE by a token-bucket filter (tc tbf) on both ends
#   of each node's link. A study selects it by interface (cluster.networks in
#   tests/slurm-lab/network.yaml). This kernel refuses netem ("Specified qdisc
#   kind is unknown"), so no delay is added: the shaped link is slower, with
#   the latency of the veth path;
# - 2 fake GPUs per node (character devices; gres.conf with AutoDetect=off),
#   so `--gres=gpu:N` works and sets CUDA_VISIBLE_DEVICES in the job; the
#   lab nodes' first half of GRES type fakea (partition lab-a), the second
#   half fakeb (lab-b): two node types, on one machine's cores.
# The nodes share this machine's file system, like a cluster's shared home.
set -euo pipefail

LAB_DIR=${LAB_DIR:-/var/tmp/trainscale-slurm-lab}
BRIDGE=tslab0
SUBNET=10.99.0
CONTROLLER_ADDRESS=$SUBNET.1
SHAPED_BRIDGE=tsshapedbr  # not tslab1: node 1's link on the first bridge
SHAPED_SUBNET=10.98.0
# Well inside what this machine sustains between namespaces (4-7 Gbit/s
# unshaped, measured with torch's gloo all-reduce), and slow enough that a
# small CNN's gradient exchange shows.
SHAPED_RATE=${SHAPED_RATE:-200mbit}
CLUSTER=trainscale-lab
CPUS_PER_NODE=${CPUS_PER_NODE:-2}
MEMORY_PER_NODE_MB=${MEMORY_PER_NODE_MB:-6000}
GPUS_PER_NODE=2
# proctrack/cgroup + task/cgroup with ConstrainRAMSpace, as on real clusters:
# a job step over its --mem is killed by the kernel and SLURM says
# OUT_OF_MEMORY. Each slurmd keeps its own tree (memory/slurm_nodeN). Used
# when this machine lets us make cgroup v1 memory groups (CGROUPS=auto);
# CGROUPS=0 falls back to proctrack/linuxproc with no memory limits.
CGROUPS=${CGROUPS:-auto}
HOSTS_TAG="# trainscale-slurm-lab"
CONF=/etc/slurm/slurm.conf
DB_PASSWORD=trainscale-lab

log() { echo "slurm-lab: $*" >&2; }
die() { log "error: $*"; exit 1; }

wait_until() { # wait_until SECONDS COMMAND...: 0 once COMMAND succeeds, 1 if it never did
  local seconds=$1
  shift
  for _ in $(seq $((seconds * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  return 1
}

wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
  local seconds=$1 what=$2
  shift 2
  wait_until "$seconds" "$@" && return
  show_logs
  die "$what did not come up within ${seconds}s"
}

show_logs() { # what SLURM and the daemons said, for a bring-up that failed (CI shows only stderr)
  sinfo -N -h -o '%N %t %E' 2>&1 | sed 's/^/slurm-lab: sinfo: /' >&2 || true
  local log
  for log in "$LAB_DIR"/*.log; do
    [ -f "$log" ] && tail -n 5 "$log" | sed "s|^|slurm-lab: $(basename "$log"): |" >&2
  done
  return 0
}

node_count() { cat "$LAB_DIR/nodes" 2>/dev/null || echo 0; }

node_group() { # node_group FIRST LAST GRES_TYPE PARTITION: nodes FIRST..LAST, their fake GPUs
  local first=$1 end=$2 type=$3 partition=$4 last=$((GPUS_PER_NODE - 1))
  echo "NodeName=node[$first-$end] CPUs=$CPUS_PER_NODE RealMemory=$MEMORY_PER_NODE_MB Gres=gpu${type:+:$type}:$GPUS_PER_NODE State=UNKNOWN" >>"$CONF"
  echo "NodeName=node[$first-$end] Name=gpu${type:+ Type=$type} File=/dev/fakegpu[0-$last]" >>/etc/slurm/gres.conf
  [ -z "$partition" ] || echo "PartitionName=$partition Nodes=node[$first-$end] MaxTime=INFINITE State=UP" >>"$CONF"
}

write_configs() { # write_configs NODES FAULT_NODES
  local nodes=$(($1 + $2)) lab_nodes=$1 controller proctrack=proctrack/linuxproc task_plugin=task/none
  controller=$(hostname -s)
  mkdir -p /etc/slurm
  if [ "$CGROUPS" = auto ]; then
    CGROUPS=0
    if mkdir /sys/fs/cgroup/memory/trainscale-lab-probe 2>/dev/null; then
      rmdir /sys/fs/cgroup/memory/trainscale-lab-probe
      CGROUPS=1
    fi
  fi
  echo "$CGROUPS" >"$LAB_DIR/cgroups"
  if [ "$CGROUPS" = 1 ]; then
    proctrack=proctrack/cgroup task_plugin=task/cgroup
    cat >/etc/slurm/cgroup.conf <<EOF
# Written by the trainscale slurm lab.
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainRAMSpace=yes
ConstrainSwapSpace=yes
AllowedSwapSpace=0
EOF
  else
    rm -f /etc/slurm/cgroup.conf
  fi
  if [ -f "$CONF" ] && ! grep -q "trainscale slurm lab" "$CONF"; then
    die "$CONF exists and is not the lab's; refusing to overwrite a real cluster's config"
  fi
  mkdir -p /etc/slurm "$LAB_DIR/state" /var/spool/slurmd
  cat >"$CONF" <<EOF
# Written by the trainscale slurm lab (tests/slurm-lab/lab.sh); removed by 'down'.
ClusterName=$CLUSTER
SlurmctldHost=$controller($CONTROLLER_ADDRESS)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$LAB_DIR/state
# Every path a slurmd writes is per node (%n): the nodes share one file system.
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=$LAB_DIR/slurmctld.pid
SlurmdPidFile=$LAB_DIR/slurmd-%n.pid
SlurmctldLogFile=$LAB_DIR/slurmctld.log
SlurmdLogFile=$LAB_DIR/slurmd-%n.log
# Without a per-node TmpFS, srun --mpi=pmix fails: the nodes share /tmp.
TmpFS=/var/spool/slurmd/%n/tmp
ProctrackType=$proctrack
TaskPlugin=$task_plugin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default, one job would take a node's whole memory.
DefMemPerCPU=500
MinJobAge=300
ReturnToService=2
SlurmdParameters=config_overrides
# A dead node is declared DOWN after this long (default 300 s). slurmctld
# pings every node each third of it; a live slurmd answers in milliseconds,
# on a busy machine too.
SlurmdTimeout=15
MpiDefault=none
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
KillWait=5
InactiveLimit=0
PartitionName=lab Nodes=node[1-$lab_nodes] Default=YES MaxTime=INFINITE State=UP
EOF
  local last=$((GPUS_PER_NODE - 1)) half=$((lab_nodes / 2))
  cat >/etc/slurm/gres.conf <<EOF
# Written by the trainscale slurm lab: fake GPUs (/dev/null-like devices).
AutoDetect=off
EOF
  # Two node types in partition lab, as a cluster has (seed 004's Titan RTX
  # and V100 nodes): the first half's GPUs are of GRES type fakea and its
  # nodes in partition lab-a too, the second half's fakeb and lab-b (a
  # study's cluster.systems sends points to each). A request of no GRES type
  # takes either. One lab node: one type-less group.
  if [ "$half" -ge 1 ]; then
    node_group 1 "$half" fakea lab-a
    node_group $((half + 1)) "$lab_nodes" fakeb lab-b
  else
    node_group 1 "$lab_nodes" "" ""
  fi
  if [ "$nodes" -gt "$lab_nodes" ]; then
    node_group $((lab_nodes + 1)) "$nodes" "" ""
    # Whole nodes per job: a node lost under one job takes no other's task.
    echo "PartitionName=faults Nodes=node[$((lab_nodes + 1))-$nodes] OverSubscribe=EXCLUSIVE MaxTime=INFINITE State=UP" >>"$CONF"
  fi
  for i in $(seq 0 "$last"); do
    [ -e "/dev/fakegpu$i" ] || mknod "/dev/fakegpu$i" c 1 3
  done
  cat >/etc/slurm/slurmdbd.conf <<EOF
# Written by the trainscale slurm lab.
DbdHost=localhost
SlurmUser=root
AuthType=auth/munge
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASSWORD
StorageLoc=slurm_acct_db
LogFile=$LAB_DIR/slurmdbd.log
PidFile=$LAB_DIR/slurmdbd.pid
EOF
  chmod 600 /etc/slurm/slurmdbd.conf
}

start_munge() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge
  # --force: a socket left by a munged that was killed must not stop this one.
  runuser -u munge -- /usr/sbin/munged --force
  wait_for 10 munged sh -c 'munge -n </dev/null | unmunge'
}

start_mariadb() {
  if ! mysqladmin ping >/dev/null 2>&1; then
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >/dev/null
    setsid mariadbd --user=mysql >"$LAB_DIR/mariadb.log" 2>&1 </dev/null &
    echo $! >"$LAB_DIR/mariadb.pid"
    wait_for 30 MariaDB mysqladmin ping
  fi
  # Accounting starts empty, as the controller's state does: job IDs start
  # again at 1 on every bring-up, and sacct showed an earlier lab's records
  # of the same IDs (a node-loss job's RESIZING ones) beside the new job's.
  mysql -e "DROP DATABASE IF EXISTS slurm_acct_db;
            CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
}

add_bridge() { # add_bridge NAME ADDRESS: a bridge with this machine's address on it
  ip link show "$1" >/dev/null 2>&1 && return
  ip link add "$1" type bridge
  ip addr add "$2/24" dev "$1"
  ip link set "$1" up
  forward_bridged accept "$1"
}

# A Docker daemon (or a firewall) on this machine loads br_netfilter, which
# sends bridged frames through iptables' FORWARD chain, and sets its policy to
# DROP: node-to-node traffic on the lab's bridges would be dropped (a job of
# two nodes never trains). Each bridge's own traffic is accepted while the
# lab is up. forward_bridged accept|remove BRIDGE
forward_bridged() {
  command -v iptables >/dev/null 2>&1 || return 0
  local rule=(FORWARD -i "$2" -o "$2" -j ACCEPT)
  if [ "$1" = accept ]; then
    iptables -C "${rule[@]}" 2>/dev/null || iptables -I "${rule[@]}"
  else
    while iptables -D "${rule[@]}" 2>/dev/null; do :; done
  fi
}

link_node() { # link_node NAMESPACE HOST_SIDE NODE_SIDE BRIDGE ADDRESS: a veth pair
  ip link add "$2" type veth peer name "$3" netns "$1"
  ip link set "$2" master "$4" up
  ip -n "$1" addr add "$5/24" dev "$3"
  ip -n "$1" link set "$3" up
}

start_network() {
  local nodes=$1
  add_bridge "$BRIDGE" "$CONTROLLER_ADDRESS"
  sed -i "/$HOSTS_TAG/d" /etc/hosts
  echo "$CONTROLLER_ADDRESS $(hostname -s)-lab $HOSTS_TAG" >>/etc/hosts
  for i in $(seq 1 "$nodes"); do
    local ns=tslab-node$i address=$SUBNET.$((10 + i))
    if ! ip netns list | grep -qw "$ns"; then
      ip netns add "$ns"
      link_node "$ns" "tslab$i" eth0 "$BRIDGE" "$address"
      ip -n "$ns" link set lo up
      ip -n "$ns" route add default via "$CONTROLLER_ADDRESS"
      no_name_servers "$ns"
    fi
    echo "$address node$i $HOSTS_TAG" >>/etc/hosts
  done
  start_shaped_network "$nodes"
}

# The machine's name servers are out of the nodes' reach (nothing routes
# their replies back): each lookup a node makes would wait out the resolver's
# timeouts, 10 s, where a cluster's DNS answers at once. torch's TCPStore
# looks up every client's (IPv4-mapped) address that way, so each job of 2 or
# more ranks started 10 s late. Unreachable, a lookup fails at once.
no_name_servers() {
  local server
  for server in $(awk '$1 == "nameserver" && $2 ~ /^[0-9.]+$/ {print $2}' /etc/resolv.conf); do
    ip -n "$1" route replace unreachable "$server/32"
  done
}

start_shaped_network() {
  local nodes=$1
  add_bridge "$SHAPED_BRIDGE" "$SHAPED_SUBNET.1"
  for i in $(seq 1 "$nodes"); do
    local ns=tslab-node$i
    # A name on this network, for TensorFlow's tasks, which find each other
    # by host name (a study's network sets TRAINSCALE_TF_HOST_SUFFIX=-shaped).
    echo "$SHAPED_SUBNET.$((10 + i)) node$i-shaped $HOSTS_TAG" >>/etc/hosts
    ip -n "$ns" link show eth1 >/dev/null 2>&1 && continue
    link_node "$ns" "tsshaped$i" eth1 "$SHAPED_BRIDGE" "$SHAPED_SUBNET.$((10 + i))"
    # Both directions: what leaves the node (eth1) and what enters it (the
    # bridge's side of its pair). burst: the bucket; latency: how long a
    # packet may queue before it is dropped.
    tc qdisc add dev "tsshaped$i" root tbf rate "$SHAPED_RATE" burst 32kbit latency 400ms
    tc -n "$ns" qdisc add dev eth1 root tbf rate "$SHAPED_RATE" burst 32kbit latency 400ms
  done
}

start_slurmd() {
  local i=$1
  # A fresh spool, as after a reboot: a killed slurmstepd leaves its PMIx
  # socket there, and the next job with the same ID could not bind it.
  rm -rf "/var/spool/slurmd/node$i"
  mkdir -p "/var/spool/slurmd/node$i/tmp"
  # nsenter, not `ip netns exec`: the latter remounts /sys and hides
  # /sys/fs/cgroup, and slurmd then refuses to start. A UTS namespace gives
  # each node its own host name, which is what the records report.
  nsenter --net="/run/netns/tslab-node$i" unshare --uts \
    sh -c "hostname node$i && exec slurmd -N node$i"
}

up() {
  local lab_nodes=${1:-2} fault_nodes=${2:-0}
  local nodes=$((lab_nodes + fault_nodes))
  [ "$(id -u)" -eq 0 ] || die "needs root"
  command -v slurmctld >/dev/null || die "SLURM is not installed: run tools/install-slurm.sh"
  if [ "$(node_count)" != 0 ] && scontrol ping >/dev/null 2>&1; then
    log "already up with $(node_count) nodes"; return
  fi
  mkdir -p "$LAB_DIR"
  echo "$nodes" >"$LAB_DIR/nodes"
  write_configs "$lab_nodes" "$fault_nodes"
  start_munge
  start_mariadb
  start_network "$nodes"

  slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
  sacctmgr -i add cluster "$CLUSTER" >/dev/null 2>&1 || true
  sacctmgr -i add account lab Description=trainscale-lab Organization=trainscale >/dev/null 2>&1 || true
  sacctmgr -i add user root Account=lab >/dev/null 2>&1 || true

  slurmctld
  wait_for 30 slurmctld scontrol ping
  for i in $(seq 1 "$nodes"); do start_slurmd "$i"; done
  wait_for 60 "the compute nodes" sh -c \
    "[ \"\$(sinfo -h -o '%t' -N | grep -c -E '^idle')\" -ge $nodes ]"
  log "up: $nodes nodes ($(sinfo -h -o '%P %N' | tr '\n' ' ')), $GPUS_PER_NODE fake GPUs each, cgroups: $(cat "$LAB_DIR/cgroups")"
}

stop_pidfile() { # stop_pidfile FILE...: SIGTERM to every one at once, SIGKILL to any left after 5 s
  local file pids=()
  for file in "$@"; do
    [ -f "$file" ] && pids+=("$(cat "$file")")
    rm -f "$file"
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null || true
  local pid alive
  for _ in $(seq 50); do
    alive=()
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
    [ ${#alive[@]} -gt 0 ] || return 0
    sleep 0.1
  done
  kill -9 "${alive[@]}" 2>/dev/null || true
}

down() {
  [ "$(id -u)" -eq 0 ] || die "needs root"
  local nodes
  nodes=$(node_count)
  scancel --user=root >/dev/null 2>&1 || true
  stop_pidfile $(seq -f "$LAB_DIR/slurmd-node%g.pid" 1 "$nodes")
  stop_pidfile "$LAB_DIR/slurmctld.pid"
  stop_pidfile "$LAB_DIR/slurmdbd.pid"
  if [ -f "$LAB_DIR/mariadb.pid" ]; then
    mysqladmin shutdown >/dev/null 2>&1 || stop_pidfile "$LAB_DIR/mariadb.pid"
    rm -f "$LAB_DIR/mariadb.pid"
  fi
  # munged may serve other things on this machine; it is cheap to leave running.
  for i in $(seq 1 "$nodes"); do
    ip netns del "tslab-node$i" 2>/dev/null || true
    ip link del "tslab$i" 2>/dev/null || true
    ip link del "tsshaped$i" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  ip link del "$SHAPED_BRIDGE" 2>/dev/null || true
  forward_bridged remove "$BRIDGE"
  forward_bridged remove "$SHAPED_BRIDGE"
  # Job IDs start again at 1 in the next lab: leave no job_N cgroups behind.
  remove_cgroups "node*"
  sed -i "/$HOSTS_TAG/d" /etc/hosts
  if grep -q "trainscale slurm lab" "$CONF" 2>/dev/null; then
    rm -f "$CONF" /etc/slurm/gres.conf /etc/slurm/slurmdbd.conf /etc/slurm/cgroup.conf
  fi
  rm -rf "$LAB_DIR/state" "$LAB_DIR/nodes" "$LAB_DIR/cgroups"
  log "down"
}

remove_cgroups() { # remove_cgroups NAME_GLOB: the cgroup trees slurmd made, once empty
  local tree
  for tree in /sys/fs/cgroup/*/slurm_$1; do
    [ -d "$tree" ] && find "$tree" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  return 0
}

kill_node() { # kill_node I: every process of node I dies at once, as in a crash
  local pids
  # Not this script: a process on the node may call it (cluster.node_fault_command);
  # out of the job's cgroups, too, so that they can be removed below.
  local procs
  for procs in /sys/fs/cgroup/*/cgroup.procs; do
    [ -e "$procs" ] && { echo $$ >"$procs"; } 2>/dev/null || true
  done
  pids=$(ip netns pids "tslab-node$1" | grep -vx "$$" || true)
  # (A short-lived one, such as `ip` above, may have gone.)
  if [ -n "$pids" ]; then kill -9 $pids 2>/dev/null || true; fi
  rm -f "$LAB_DIR/slurmd-node$1.pid"
  # A rebooted node starts with no cgroups; stale ones would clash with the
  # next job given the same ID. They empty as the kernel reaps the processes.
  wait_until 30 cgroups_empty "node$1" || true
  remove_cgroups "node$1"
  log "node$1: killed $(echo $pids | wc -w) processes"
}

revive_node() { # revive_node I: a fresh slurmd on node I, back in service
  start_slurmd "$1"
  scontrol update nodename="node$1" state=resume >/dev/null 2>&1 || true
  wait_for 60 "node$1" sh -c "sinfo -h -n node$1 -o '%t' | grep -q -E '^(idle|mix|alloc)'"
  log "node$1: back"
}

cgroups_empty() { # cgroups_empty NAME: no process left in slurmd's cgroup trees of NAME
  [ -z "$(find /sys/fs/cgroup/*/slurm_$1 -name cgroup.procs -exec cat {} + 2>/dev/null)" ]
}

reboot_node() { # reboot_node I: node I crashes, and is back once SLURM has declared it down
  kill_node "$1"
  # SlurmdTimeout (15 s above) after its last answer, as after a real crash.
  wait_for 300 "node$1 declared down" sh -c "sinfo -h -n node$1 -o '%t' | grep -q '^down'"
  revive_node "$1"
}

status() {
  scontrol ping && sinfo -N && squeue
}

case "${1:-}" in
  up) up "${2:-2}" "${3:-0}" ;;
  down) down ;;
  status) status ;;
  kill-node) kill_node "${2#node}" ;;   # I, or its name nodeI
  revive-node) revive_node "${2#node}" ;;
  reboot-node) reboot_node "${2#node}" ;;
  *) echo "usage: $0 up [NODES [FAULT_NODES]] | down | status | kill-node I | revive-node I | reboot-node I" >&2; exit 2 ;;
esac
