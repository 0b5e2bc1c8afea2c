package etcdbridge

import (
	"math"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// putTxn is a transaction of puts built as etcd's request itself, its
// messages in a few arrays: clientv3's Op copies every key and value twice
// on the way to the same request, and the OpLog's export, which puts every
// committed mutation, was a fifth of a leader's allocations with it.
type putTxn struct {
	req   pb.TxnRequest
	puts  []pb.PutRequest
	wraps []pb.RequestOp_RequestPut
	ops   []pb.RequestOp
}

// newPutTxn returns a transaction with room for n puts.
func newPutTxn(n int) *putTxn {
	t := &putTxn{puts: make([]pb.PutRequest, n), wraps: make([]pb.RequestOp_RequestPut, n), ops: make([]pb.RequestOp, n)}
	t.req.Success = make([]*pb.RequestOp, 0, n)
	return t
}

// put adds a put of key and value (kept, not copied) to the success branch.
// It takes at most newPutTxn's n.
func (t *putTxn) put(key, value []byte) {
	i := len(t.req.Success)
	p := &t.puts[i]
	p.Key, p.Value = key, value
	t.wraps[i].RequestPut = p
	t.ops[i].Request = &t.wraps[i]
	t.req.Success = append(t.req.Success, &t.ops[i])
}

// kvCallOpts are the call options clientv3's KV gives every call when its
// Config sets none, as Open's does not: wait for a connection, and
// clientv3's default message sizes.
var kvCallOpts = []grpc.CallOption{
	grpc.WaitForReady(true),
	grpc.MaxCallSendMsgSize(2 * 1024 * 1024),
	grpc.MaxCallRecvMsgSize(math.MaxInt32),
}
