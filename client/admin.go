package client

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/moonraft/moonraft/errcode"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/grpc"
)

// Status asks one node, by its endpoint, for its status; no retry.
func (c *Client) Status(ctx context.Context, endpoint string) (*moonraftpb.NodeStatus, error) {
	return c.status(ctx, endpoint, false)
}

// Progress is Status without the digests, which cost the node a pass over
// its whole state: for polling applied indexes.
func (c *Client) Progress(ctx context.Context, endpoint string) (*moonraftpb.NodeStatus, error) {
	return c.status(ctx, endpoint, true)
}

func (c *Client) status(ctx context.Context, endpoint string, skipDigests bool) (*moonraftpb.NodeStatus, error) {
	cc, err := c.conn(endpoint)
	if err != nil {
		return nil, err
	}
	r, err := moonraftpb.NewMasterClient(cc).Status(ctx, &moonraftpb.StatusRequest{SkipDigests: skipDigests})
	if err != nil {
		e, _ := c.rpcError(endpoint, err, true, true)
		return nil, e
	}
	if err := moonraftpb.ErrorOf(r.GetStatus()); err != nil {
		return nil, err
	}
	return r.GetNode(), nil
}

// StatusAll asks every known endpoint (Endpoints) for its status at once;
// the i-th status or error is the i-th endpoint's.
func (c *Client) StatusAll(ctx context.Context) ([]*moonraftpb.NodeStatus, []error) {
	eps := c.Endpoints()
	sts, errs := make([]*moonraftpb.NodeStatus, len(eps)), make([]error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() { sts[i], errs[i] = c.Status(ctx, ep) })
	}
	wg.Wait()
	return sts, errs
}

// Members lists the Raft configuration.
func (c *Client) Members(ctx context.Context) ([]*moonraftpb.Member, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.Members, &moonraftpb.MembersRequest{})
	if err != nil {
		return nil, err
	}
	return r.GetMembers(), nil
}

// AddVoter adds server id at raftAddr as a voter and records its client
// address grpcAddr (if not ""); retried, since adding the same voter again
// leaves the configuration as it is.
func (c *Client) AddVoter(ctx context.Context, id, raftAddr, grpcAddr string) error {
	_, err := call(ctx, c, true, moonraftpb.MasterClient.AddVoter, &moonraftpb.AddVoterRequest{Id: id, RaftAddr: raftAddr, GrpcAddr: grpcAddr})
	return err
}

// RemoveServer removes server id from the configuration; retried like AddVoter.
func (c *Client) RemoveServer(ctx context.Context, id string) error {
	_, err := call(ctx, c, true, moonraftpb.MasterClient.RemoveServer, &moonraftpb.RemoveServerRequest{Id: id})
	return err
}

// TransferLeadership hands leadership to id ("" for any voter). Not resent:
// a second transfer would move leadership away from the new leader.
func (c *Client) TransferLeadership(ctx context.Context, id string) error {
	_, err := call(ctx, c, false, moonraftpb.MasterClient.TransferLeadership, &moonraftpb.TransferLeadershipRequest{Id: id})
	return err
}

// SnapshotSave writes a fresh snapshot of the leader's state into w. It is
// retried (at the leader) only until the first byte reaches w.
func (c *Client) SnapshotSave(ctx context.Context, w io.Writer) error {
	return c.do(ctx, retryMode{idempotent: true}, func(ctx context.Context, mc moonraftpb.MasterClient, sent grpc.CallOption) (*moonraftpb.Status, error) {
		stream, err := mc.SnapshotSave(ctx, &moonraftpb.SnapshotSaveRequest{}, sent)
		if err != nil {
			return nil, err
		}
		written := false
		for {
			chunk, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return &moonraftpb.Status{Name: errcode.OK.String()}, nil
			}
			if err != nil {
				if written {
					e, _ := c.rpcError("the leader", err, true, true)
					return nil, permanent{e}
				}
				return nil, err
			}
			written = true
			if _, err := w.Write(chunk.GetData()); err != nil {
				return nil, permanent{errcode.New(errcode.FileWriteFail, "writing the snapshot: %v", err)}
			}
		}
	})
}

// SnapshotRestore uploads the snapshot read from r and restores the cluster
// from it. A restore that may have reached the leader is not resent
// (OUTCOME_UNKNOWN); one refused by a follower is resent to the leader only
// if r is an io.Seeker, rewound to where it started.
func (c *Client) SnapshotRestore(ctx context.Context, r io.Reader) error {
	seeker, _ := r.(io.Seeker)
	var start int64
	if seeker != nil {
		var err error
		if start, err = seeker.Seek(0, io.SeekCurrent); err != nil {
			seeker = nil
		}
	}
	consumed := false
	var refused error
	return c.do(ctx, retryMode{}, func(ctx context.Context, mc moonraftpb.MasterClient, sent grpc.CallOption) (*moonraftpb.Status, error) {
		if consumed {
			if seeker == nil {
				return nil, permanent{errcode.New(errcode.InvalidParams,
					"the snapshot was refused (%v) and cannot be sent again: its reader cannot be rewound; pass an io.ReadSeeker such as an *os.File", refused)}
			}
			if _, err := seeker.Seek(start, io.SeekStart); err != nil {
				return nil, permanent{errcode.New(errcode.FileReadFail, "rewinding the snapshot: %v", err)}
			}
		}
		st, err := c.restoreOnce(ctx, mc, sent, r, &consumed)
		refused = err
		if st != nil {
			refused = moonraftpb.ErrorOf(st)
		}
		return st, err
	})
}

func (c *Client) restoreOnce(ctx context.Context, mc moonraftpb.MasterClient, sent grpc.CallOption, r io.Reader, consumed *bool) (*moonraftpb.Status, error) {
	// Cancelling the stream on a read error tells the server the upload is
	// incomplete, so it restores nothing.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := mc.SnapshotRestore(ctx, sent)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, moonraftpb.SnapshotChunkBytes)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			*consumed = true
			// io.EOF here means the server has answered already (e.g.
			// NOT_LEADER): CloseAndRecv below returns its answer.
			if err := stream.Send(&moonraftpb.SnapshotChunk{Data: buf[:n]}); err != nil {
				break
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return nil, permanent{errcode.New(errcode.FileReadFail, "reading the snapshot: %v", rerr)}
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return resp.GetStatus(), nil
}
