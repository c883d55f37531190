// Command qstate-rawgrpc is a gRPC server that answers every unary call with the same bytes,
// whatever it is asked: the ceiling of a gRPC load generator on the CPU it is given, against
// which loadtest/bench_cluster_reads.py reads the router's gRPC rows (a raw server's row, as
// Redis is the HTTP rows' one; loadtest/results/cluster_reads.md).
//
//	qstate-rawgrpc --listen 127.0.0.1:50099 --reply-hex 0a02...
//
// It prints nothing; it ends on SIGTERM or SIGINT (exit 0), or at once with 2 on a bad flag.
package main

import (
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
)

// raw passes a message's bytes through, so the server decodes and encodes nothing.
type raw struct{}

func (raw) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (raw) Unmarshal(b []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), b...)
	return nil
}
func (raw) Name() string { return "proto" }

var _ encoding.Codec = raw{}

func main() {
	listen := flag.String("listen", "127.0.0.1:50099", "address to serve on")
	replyHex := flag.String("reply-hex", "", "the bytes of every answer's message, in hex")
	flag.Parse()
	reply, err := hex.DecodeString(*replyHex)
	if err != nil {
		fmt.Fprintf(os.Stderr, "--reply-hex: %v\n", err)
		os.Exit(2)
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "--listen %s: %v\n", *listen, err)
		os.Exit(2)
	}
	s := grpc.NewServer(grpc.ForceServerCodec(raw{}),
		grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
			var in []byte
			if err := st.RecvMsg(&in); err != nil {
				return err
			}
			out := reply
			return st.SendMsg(&out)
		}))
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-stop; s.Stop() }()
	if err := s.Serve(lis); err != nil {
		fmt.Fprintf(os.Stderr, "serve: %v\n", err)
		os.Exit(1)
	}
}
