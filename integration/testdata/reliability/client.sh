#!/usr/bin/env bash
# Shell load generator of the reliability suite (integration/reliability_test.go).
#
# Loops over lease names the way a shell user would:
#   token    set -C; exec 3>lease (create), cat /dev/fd/3 (token, then the status
#            document of that very lease), echo "$tok" >&3 (renew), a TOML
#            complete command written with one cat (release)
#   flockfd  set -C; exec 3>lease, flock -n 3 (binds the reservation as a handle
#            lease), cat /dev/fd/3 (checks), flock -u 3 or close (release)
#   flock1   flock -n lease CMD: flock(1) holds the name while CMD runs
#   flock1w  flock -w SECS lease CMD: waits first come first served
#
# Every operation is logged with CLOCK_MONOTONIC timestamps ("now at" of
# /proc/timer_list, or `$GOCLIENT mono`). Environment: M, NAMES, LEASE_MS,
# LOG, MODES (comma separated), GOCLIENT. Log lines as in testdata/goclient.
# `source client.sh --functions` defines the functions only (flock(1) runs
# flock1_child that way).
set -C
exec 9>>"$LOG"
# Beside the log, in the test's directory: a client SIGKILLed by the test
# never runs the EXIT trap.
ERRF=$(mktemp "${LOG%.log}.err.XXXXXX")
trap 'rm -f "$ERRF"' EXIT
read -r -a names <<<"$NAMES"
IFS=, read -r -a modes <<<"$MODES"
seq=0

if { read -r; read -r; read -r _ _ NOW _; } </proc/timer_list 2>/dev/null && [[ $NOW =~ ^[0-9]+$ ]]; then
	stamp() { { read -r; read -r; read -r _ _ NOW _; } </proc/timer_list; WALL=${EPOCHREALTIME/./}000; }
else
	stamp() { read -r NOW WALL < <("$GOCLIENT" mono); }
fi

# ename maps the last error message in $ERRF to an errno name.
ename() {
	local msg
	msg=$(<"$ERRF")
	case $msg in
	*"cannot overwrite existing file"* | *"File exists"*) echo EEXIST ;;
	*"Stale file handle"*) echo ESTALE ;;
	*"Transport endpoint is not connected"*) echo ENOTCONN ;;
	*"Software caused connection abort"*) echo ECONNABORTED ;;
	*"No such file or directory"*) echo ENOENT ;;
	*"Permission denied"*) echo EACCES ;;
	*"Resource temporarily unavailable"*) echo EWOULDBLOCK ;;
	*"Input/output error"*) echo EIO ;;
	*"Interrupted system call"*) echo EINTR ;;
	*"No locks available"*) echo ENOLCK ;;
	*"Invalid argument"*) echo EINVAL ;;
	*) echo "ERR" ;;
	esac
}

nap() { sleep "0.$(printf '%03d' $((RANDOM % ($2 - $1) + $1)))"; }

begin() { # op name mode lease gen
	seq=$((seq + 1))
	stamp
	echo "B $seq $1 $2 $3 $4 $5 $NOW $WALL" >&9
}

end() { # seq result lease gen [token]
	stamp
	echo "E $1 $2 $3 $4 $NOW ${5:--}" >&9
}

# parse sets LID and GEN from the status document in $1; it fails unless the
# lease is active.
parse() {
	LID=- GEN=0
	[[ $1 =~ lease_id\ =\ \"([^\"]+)\" ]] && LID=${BASH_REMATCH[1]}
	[[ $1 =~ generation\ =\ ([0-9]+) ]] && GEN=${BASH_REMATCH[1]}
	[[ $1 =~ status\ =\ \"active\" && $LID != - && $GEN != 0 ]]
}

token_cycle() {
	local name=$1 p=$M/$1 s tok doc res
	begin acq "$name" token - 0
	s=$seq
	if ! { exec 3>"$p"; } 2>|"$ERRF"; then
		end "$s" "$(ename)" - 0
		nap 50 200
		return
	fi
	if ! tok=$(cat /dev/fd/3 2>|"$ERRF"); then
		end "$s" "lost-$(ename)" - 0
		exec 3>&-
		return
	fi
	if ! [[ $tok =~ ^hwl_[a-z2-7]{39}$ ]]; then
		# What was read instead, beside the log for whoever reads a
		# failed run's kept logs.
		printf '%s\n' "$tok" >|"${LOG%.log}.notoken.$s"
		end "$s" notoken - 0
		exec 3>&-
		return
	fi
	if ! doc=$(cat /dev/fd/3 2>|"$ERRF") || ! parse "$doc"; then
		end "$s" "lost-$(ename)" - 0 "$tok"
		exec 3>&-
		return
	fi
	if ! [[ $doc =~ holder_pid\ =\ $BASHPID($'\n'|$) ]]; then
		# Another process's lease: ours expired while this client stalled
		# after its create, and a read through /dev/fd/3 is a path open,
		# which shows the name's current lease (docs/PROTOCOL.md §3).
		end "$s" lost-ESTALE - 0 "$tok"
		exec 3>&-
		return
	fi
	local lid=$LID gen=$GEN
	end "$s" ok "$lid" "$gen" "$tok"
	local i n=$((RANDOM % 4 + 1))
	for ((i = 0; i < n; i++)); do
		nap 100 600
		begin renew "$name" token "$lid" "$gen"
		s=$seq
		if { echo "$tok" >&3; } 2>|"$ERRF"; then
			end "$s" ok "$lid" "$gen"
			continue
		fi
		res=$(ename)
		end "$s" "$res" "$lid" "$gen"
		if [[ $res == ESTALE ]]; then
			begin renew "$name" token "$lid" "$gen"
			s=$seq
			if { echo "$tok" >&3; } 2>|"$ERRF"; then
				end "$s" ok "$lid" "$gen"
			else
				end "$s" "$(ename)" "$lid" "$gen"
			fi
		fi
		exec 3>&-
		return
	done
	begin rel "$name" token "$lid" "$gen"
	s=$seq
	if { cat >&3 <<EOF; } 2>|"$ERRF"; then
token = "$tok"
action = "complete"
EOF
		end "$s" ok "$lid" "$gen" complete
	else
		end "$s" "$(ename)" "$lid" "$gen" complete
	fi
	exec 3>&-
}

flockfd_cycle() {
	local name=$1 p=$M/$1 s doc rc res
	begin acq "$name" flockfd - 0
	s=$seq
	if ! { exec 3>"$p"; } 2>|"$ERRF"; then
		end "$s" "$(ename)" - 0
		nap 50 200
		return
	fi
	flock -n -E 75 3 2>|"$ERRF"
	rc=$?
	if ((rc != 0)); then
		if ((rc == 75)); then end "$s" EWOULDBLOCK - 0; else end "$s" "$(ename)" - 0; fi
		exec 3>&-
		return
	fi
	local lid=- gen=0
	if doc=$(cat /dev/fd/3 2>|"$ERRF") && parse "$doc"; then
		lid=$LID gen=$GEN
		end "$s" ok "$lid" "$gen"
		local i n=$((RANDOM % 3 + 1))
		for ((i = 0; i < n; i++)); do
			nap 100 400
			begin check "$name" flockfd "$lid" "$gen"
			s=$seq
			if doc=$(cat /dev/fd/3 2>|"$ERRF"); then
				if parse "$doc" && [[ $LID == "$lid" && $GEN == "$gen" ]]; then
					end "$s" ok "$LID" "$GEN"
					continue
				fi
				end "$s" mismatch "$LID" "$GEN"
			else
				end "$s" "$(ename)" "$lid" "$gen"
			fi
			break
		done
	else
		end "$s" "lost-$(ename)" - 0
	fi
	begin rel "$name" flockfd "$lid" "$gen"
	s=$seq
	res=ok action=close
	if ((RANDOM % 2)); then
		action=unlock
		flock -u 3 2>|"$ERRF" || res=$(ename)
	fi
	exec 3>&-
	end "$s" "$res" "$lid" "$gen" "$action"
}

# detached_fd reports whether this process has a descriptor of lease $1 on a
# mount that is no longer at $M (a detached mount shows paths from its own
# root).
detached_fd() {
	local f
	for f in /proc/$BASHPID/fd/*; do
		case $(readlink "$f" 2>/dev/null) in
		"$M/"*) ;;
		*"/$1" | *"/$1 (deleted)") return 0 ;;
		esac
	done
	return 1
}

# flock1_child runs under flock(1) holding the name; $1 name, $2 mode, $3 seq.
flock1_child() {
	local name=$1 mode=$2 s=$3 fd f doc lid=- gen=0 res=ok
	# flock(1)'s descriptor; a waiter's names the lease it opened, which has
	# ended since (the kernel then shows the path as deleted).
	for f in /proc/$BASHPID/fd/*; do
		case $(readlink "$f" 2>/dev/null) in
		"$M/$name" | "$M/$name (deleted)") fd=${f##*/} ;;
		esac
	done
	# Read with the builtin: cat would fstat its input, and fstat of a waiter's
	# re-bound descriptor is not reliable (see TestReliabilityWaiterFstat).
	doc=
	if [[ -n $fd ]]; then
		{ IFS= read -r -d '' doc <&"$fd"; } 2>|"$ERRF"
	fi
	if parse "$doc"; then
		lid=$LID gen=$GEN
	elif [[ -z $fd ]] && detached_fd "$name"; then
		# flock(1)'s descriptor is on a mount that a restarted daemon has
		# detached: the daemon that granted the lock is gone.
		res=lost-DETACHED
	else
		res="lost-$(ename)"
	fi
	end "$s" "$res" "$lid" "$gen"
	nap 100 900
	seq=$((s + 1))
	stamp
	echo "B $seq rel $name $mode $lid $gen $NOW $WALL" >&9
}

flock1_cycle() {
	local name=$1 mode=$2 p=$M/$1 s rc
	begin acq "$name" "$mode" - 0
	s=$seq
	if [[ $mode == flock1 ]]; then
		flock -n -E 75 "$p" bash -c 'source "$0" --functions; flock1_child "$@"' "$FUNCS" "$name" "$mode" "$s" 2>|"$ERRF"
	else
		flock -w "1.$((RANDOM % 10))" -E 75 "$p" bash -c 'source "$0" --functions; flock1_child "$@"' "$FUNCS" "$name" "$mode" "$s" 2>|"$ERRF"
	fi
	rc=$?
	case $rc in
	0)
		seq=$((s + 1))
		end "$seq" ok - 0 close
		;;
	75) end "$s" EWOULDBLOCK - 0 ;;
	*) end "$s" "$(ename)" - 0 ;;
	esac
}

if [[ ${1:-} == --functions ]]; then
	return 0 2>/dev/null || exit 0
fi
FUNCS=$0
export M LOG GOCLIENT

while :; do
	name=${names[RANDOM % ${#names[@]}]}
	mode=${modes[RANDOM % ${#modes[@]}]}
	case $mode in
	token) token_cycle "$name" ;;
	flockfd) flockfd_cycle "$name" ;;
	flock1 | flock1w) flock1_cycle "$name" "$mode" ;;
	*)
		echo "unknown mode $mode" >&2
		exit 2
		;;
	esac
	nap 50 250
done
