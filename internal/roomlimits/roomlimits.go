// Package roomlimits joins rooms' limits to custody's: a room's Limits as
// custody applies them, and what custody can enforce as the room's
// Resources report. The room transports (RPC, ACP) share it.
package roomlimits

import (
	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/room"
)

// Custody is l as custody's limits.
func Custody(l room.Limits) custody.Limits {
	return custody.Limits{Memory: int64(l.Memory), Pids: l.Pids, CPU: l.CPU}
}

// Room is l as a room's limits.
func Room(l custody.Limits) room.Limits {
	return room.Limits{Memory: room.Bytes(l.Memory), Pids: l.Pids, CPU: l.CPU}
}

// Resources reports how s holds l (zero l: how it would hold limits).
func Resources(s custody.Support, l room.Limits) room.Resources {
	return room.Resources{Enforced: s.Enforced(), Why: s.Why, Memory: int64(l.Memory), Pids: l.Pids, CPU: l.CPU,
		By: byOf(s)}
}

func byOf(s custody.Support) (by room.ResourcesBy) {
	by.Memory, by.Pids, by.CPU = string(s.Memory), string(s.Pids), string(s.CPU)
	return by
}

// Meter is u as a room's meter.
func Meter(u custody.Usage) room.Meter {
	return room.Meter{CPU: u.CPU, PeakMemory: u.PeakMemory, Processes: u.Processes, OOMKills: u.OOMKills,
		ForksRefused: u.ForksRefused, Metered: u.Metered}
}
