package client

import (
	"context"

	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// withToken adds the admin token to the outgoing metadata of admin RPCs.
func withToken(ctx context.Context, method, token string) context.Context {
	if token == "" || !moonraftpb.AdminMethod(method) {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, moonraftpb.AuthHeader, "Bearer "+token)
}

func tokenUnary(token string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(withToken(ctx, method, token), method, req, reply, cc, opts...)
	}
}

func tokenStream(token string) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(withToken(ctx, method, token), desc, cc, method, opts...)
	}
}
