package main

import (
	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

// What --json prints, one type per shape, every name snake_case and every
// field always present (docs/CLI.md lists them; tests/moonctl_test.go pins
// them).

type resultJSON struct {
	Result string `json:"result"`
}

type pingJSON struct {
	ClientStatus string `json:"client_status"`
	TTLMs        int64  `json:"ttl_ms"`
	ViewVersion  uint64 `json:"view_version"`
}

// objectJSON is one object: put, upsert, put-start, get, and each of ls.
type objectJSON struct {
	Key          string              `json:"key"`
	Replicas     []oplog.ReplicaDesc `json:"replicas"`
	LeaseUntilMs int64               `json:"lease_until_ms"`
}

func objectsJSON(objs []client.KeyReplicas) []objectJSON {
	out := make([]objectJSON, len(objs))
	for i, o := range objs {
		out[i] = objectJSON{o.Key, o.Replicas, o.LeaseUntilMs}
	}
	return out
}

type existJSON struct {
	Key    string `json:"key"`
	Exists bool   `json:"exists"`
}

type removedJSON struct {
	Removed uint64             `json:"removed"`
	Results []removeResultJSON `json:"results"` // rm with several keys; else empty
}

type removeResultJSON struct {
	Key    string `json:"key"`
	Result string `json:"result"` // OK, or the error
}

type segmentJSON struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	ClientID     string `json:"client_id"`
	State        string `json:"state"`
	Base         uint64 `json:"base"`
	Size         uint64 `json:"size"`
	UsedBytes    uint64 `json:"used_bytes"`
	Objects      uint64 `json:"objects"`
	DrainUntilMs int64  `json:"drain_until_ms"`
}

func segmentsJSON(sts []client.SegmentStatus) []segmentJSON {
	out := make([]segmentJSON, len(sts))
	for i, st := range sts {
		out[i] = segmentJSON{st.Segment.ID, st.Segment.Name, st.ClientID, st.State, st.Segment.Base, st.Segment.Size, st.UsedBytes, st.Objects, st.DrainUntilMs}
	}
	return out
}

type memberJSON struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	GRPCAddr string `json:"grpc_addr"`
	Suffrage string `json:"suffrage"`
	Leader   bool   `json:"leader"`
}

func membersJSON(ms []*moonraftpb.Member) []memberJSON {
	out := make([]memberJSON, len(ms))
	for i, m := range ms {
		out[i] = memberJSON{m.Id, m.RaftAddr, m.GrpcAddr, m.Suffrage, m.Leader}
	}
	return out
}

// nodeStatusJSON is one endpoint of status: the node's answer, or the error
// that kept it from answering.
type nodeStatusJSON struct {
	Endpoint             string     `json:"endpoint"`
	Error                *errorJSON `json:"error"`
	ID                   string     `json:"id"`
	RaftAddr             string     `json:"raft_addr"`
	GRPCAddr             string     `json:"grpc_addr"`
	HTTPAddr             string     `json:"http_addr"`
	Role                 string     `json:"role"`
	Promoted             bool       `json:"promoted"`
	Term                 uint64     `json:"term"`
	LeaderID             string     `json:"leader_id"`
	LeaderGRPCAddr       string     `json:"leader_grpc_addr"`
	ReadMode             string     `json:"read_mode"`
	ReadLeaseRemainingMs int64      `json:"read_lease_remaining_ms"`
	AppliedIndex         uint64     `json:"applied_index"`
	CommitIndex          uint64     `json:"commit_index"`
	LastLogIndex         uint64     `json:"last_log_index"`
	LastContactMs        int64      `json:"last_contact_ms"`
	AppliedSeq           uint64     `json:"applied_seq"`
	EtcdExport           bool       `json:"etcd_export"`
	ExportedSeq          uint64     `json:"exported_seq"`
	ExportRingLen        uint64     `json:"export_ring_len"`
	Objects              uint64     `json:"objects"`
	Segments             uint64     `json:"segments"`
	Sessions             uint64     `json:"sessions"`
	UsedBytes            uint64     `json:"used_bytes"`
	CapacityBytes        uint64     `json:"capacity_bytes"`
	NowMs                int64      `json:"now_ms"`
	Digest               string     `json:"digest"`
	ObjectSetDigest      string     `json:"object_set_digest"`
	DiskError            string     `json:"disk_error"`
	ExportBacklogMs      int64      `json:"export_backlog_ms"`
	ExportTakeRate       float64    `json:"export_take_rate"`
	WritesPaced          uint64     `json:"writes_paced"`
	EtcdError            string     `json:"etcd_error"`
	ExportDeferred       uint64     `json:"export_deferred"`
}

func statusJSON(endpoints []string, sts []*moonraftpb.NodeStatus, errs []error) []nodeStatusJSON {
	out := make([]nodeStatusJSON, len(sts))
	for i, s := range sts {
		o := &out[i]
		o.Endpoint = endpoints[i]
		if errs[i] != nil || s == nil {
			err := errs[i]
			if err == nil {
				err = errcode.New(errcode.InternalError, "no status and no error")
			}
			e := toErrorJSON(err)
			o.Error = &e
			continue
		}
		*o = nodeStatusJSON{Endpoint: endpoints[i], ID: s.Id, RaftAddr: s.RaftAddr, GRPCAddr: s.GrpcAddr, HTTPAddr: s.HttpAddr,
			Role: s.Role, Promoted: s.Promoted, Term: s.Term, LeaderID: s.LeaderId, LeaderGRPCAddr: s.LeaderGrpcAddr,
			ReadMode: s.ReadMode, ReadLeaseRemainingMs: s.ReadLeaseRemainingMs, AppliedIndex: s.AppliedIndex,
			CommitIndex: s.CommitIndex, LastLogIndex: s.LastLogIndex, LastContactMs: s.LastContactMs, AppliedSeq: s.AppliedSeq, EtcdExport: s.EtcdExport, ExportedSeq: s.ExportedSeq,
			ExportRingLen: s.ExportRingLen, Objects: s.Objects, Segments: s.Segments, Sessions: s.Sessions,
			UsedBytes: s.UsedBytes, CapacityBytes: s.CapacityBytes, NowMs: s.NowMs, Digest: s.Digest,
			ObjectSetDigest: s.ObjectSetDigest, DiskError: s.DiskError, ExportBacklogMs: s.ExportBacklogMs,
			ExportTakeRate: s.ExportTakeRate, WritesPaced: s.WritesPaced, EtcdError: s.EtcdError,
			ExportDeferred: s.ExportDeferred}
	}
	return out
}

type summaryJSON struct {
	File          string `json:"file"`
	FormatVersion uint32 `json:"format_version"`
	ClusterID     string `json:"cluster_id"`
	NodeID        string `json:"node_id"`
	CreatedUnixMs int64  `json:"created_unix_ms"`
	RaftIndex     uint64 `json:"raft_index"`
	RaftTerm      uint64 `json:"raft_term"`
	AppliedSeq    uint64 `json:"applied_seq"`
	Segments      uint64 `json:"segments"`
	Sessions      uint64 `json:"sessions"`
	Objects       uint64 `json:"objects"`
	Bytes         uint64 `json:"bytes"`
	FileBytes     int64  `json:"file_bytes"`
	Digest        string `json:"digest"`
	ChecksumOK    bool   `json:"checksum_ok"`
	// StateDigest is the restored state's digest, with inspect --restore.
	StateDigest string `json:"state_digest,omitempty"`
}

// restoreJSON is what snapshot restore --offline produced.
type restoreJSON struct {
	DataDir         string `json:"data_dir"`
	ID              string `json:"id"`
	SnapshotSeq     uint64 `json:"snapshot_seq"`
	AppliedSeq      uint64 `json:"applied_seq"`
	Replayed        uint64 `json:"replayed"`
	ReplayMs        int64  `json:"replay_ms"`
	Gap             bool   `json:"gap"`
	Skipped         uint64 `json:"skipped"`
	StaleDropped    uint64 `json:"stale_dropped"`
	Digest          string `json:"digest"`
	ObjectSetDigest string `json:"object_set_digest"`
	RaftIndex       uint64 `json:"raft_index"`
	RaftTerm        uint64 `json:"raft_term"`
}
