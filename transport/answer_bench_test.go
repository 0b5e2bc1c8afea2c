package transport

import (
	"fmt"
	"testing"

	"github.com/moonraft/moonraft/fsm"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/protobuf/proto"
)

// BenchmarkBatchGetAnswer is the gRPC server's answer to moonbench's
// batch-get, 32 keys of one 4 KiB replica each, built and marshalled as
// gRPC's codec does. What it allocates per call is what the leader's
// collector must catch up with at 400,000 keys a second
// (docs/BENCHMARKS.md, the sweep's batch gets).
//
//	go test -run '^$' -bench BatchGetAnswer -benchmem ./transport/
func BenchmarkBatchGetAnswer(b *testing.B) {
	be := &testBackend{f: fsm.New()}
	be.apply(b, &fsm.MountSegment{NowMs: be.Now(), ClientID: "c1", Segment: seg("s1", 0)})
	req := &moonraftpb.BatchGetReplicaListRequest{}
	for i := range 32 {
		k := fmt.Sprintf("moonbench-%d", i)
		be.apply(b, &fsm.PutStart{NowMs: be.Now(), Key: k, SliceLengths: []uint64{4096}, ReplicaNum: 1, ClientID: "c1"})
		be.apply(b, &fsm.PutEnd{NowMs: be.Now(), Key: k, ClientID: "c1"})
		req.Keys = append(req.Keys, k)
	}
	srv := &server{b: be, lim: newGuard(ServerConfig{}).cfg.Limits}
	b.ReportAllocs()
	for b.Loop() {
		resp, err := srv.BatchGetReplicaList(b.Context(), req)
		if err != nil || len(resp.GetResults()) != 32 || len(resp.GetResults()[31].GetReplicas()) != 1 {
			b.Fatal(err, resp)
		}
		if _, err := proto.Marshal(resp); err != nil {
			b.Fatal(err)
		}
	}
}
