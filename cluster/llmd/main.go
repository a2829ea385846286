package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/llm-d/llm-d-router/pkg/kvcache/kvblock"
	"github.com/llm-d/llm-d-router/pkg/kvevents"
	"github.com/llm-d/llm-d-router/pkg/kvevents/engineadapter"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// errConfig marks a setup failure of llm-d's components.
var errConfig = errors.New("llmd-router: setup")

// router is llm-d's consumer (pool, subscribers, index) behind the harness's routes.
type router struct {
	ctx       context.Context
	index     *seenIndex
	pool      *kvevents.Pool
	subs      *kvevents.SubscriberManager
	topic     string
	model     string
	blockSize int
}

// newRouter wires llm-d's components as its pod-reconciler example does (doc.go), the block size set.
func newRouter(ctx context.Context, blockSize int, model string) (*router, error) {
	inner, err := kvblock.NewIndex(ctx, kvblock.DefaultIndexConfig())
	if err != nil {
		return nil, fmt.Errorf("%w: index: %w", errConfig, err)
	}
	index := newSeenIndex(inner)
	poolCfg := kvevents.DefaultConfig()
	tpCfg := kvblock.DefaultTokenProcessorConfig()
	tpCfg.BlockSizeTokens = blockSize
	tp, err := kvblock.NewChunkedTokenDatabase(tpCfg)
	if err != nil {
		return nil, fmt.Errorf("%w: token processor: %w", errConfig, err)
	}
	adapter, err := engineadapter.NewAdapter(poolCfg.EngineType)
	if err != nil {
		return nil, fmt.Errorf("%w: adapter: %w", errConfig, err)
	}
	pool := kvevents.NewPool(poolCfg, index, tp, adapter)
	return &router{ctx: ctx, index: index, pool: pool, subs: kvevents.NewSubscriberManager(pool),
		topic: poolCfg.TopicFilter, model: model, blockSize: blockSize}, nil
}

// registration is the body of POST /register (Dynamo's; only these fields matter to llm-d).
type registration struct {
	InstanceID     *int64 `json:"instance_id"`
	DPRank         int64  `json:"dp_rank"`
	Endpoint       string `json:"endpoint"`
	ReplayEndpoint string `json:"replay_endpoint"`
}

// subscribe is EnsureSubscriber for the cluster's pod "W-R" as llm-d's precise-prefix-cache producer calls it
// (remote, dialled): the pod is also the source endpoint, which llm-d files the pod's blocks under (overriding
// the topic's pod) and clears when a replay fails or the publisher's seq resets. An empty replay endpoint turns
// llm-d's replay off.
func (rt *router) subscribe(reg registration) error {
	pod := podKey{*reg.InstanceID, reg.DPRank}.String()
	return rt.subs.EnsureSubscriber(rt.ctx, pod, pod, reg.Endpoint, reg.ReplayEndpoint, rt.topic, true)
}

func (rt *router) mux() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	m.HandleFunc("POST /register", func(w http.ResponseWriter, r *http.Request) {
		var reg registration
		if err := json.NewDecoder(r.Body).Decode(&reg); err != nil || reg.InstanceID == nil || reg.Endpoint == "" {
			http.Error(w, "want {instance_id, dp_rank, endpoint}", http.StatusBadRequest)
			return
		}
		if err := rt.subscribe(reg); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	m.HandleFunc("GET /dump", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(dumpDoc(rt.model, rt.blockSize, rt.index.holdings(r.Context())))
	})
	return m
}

func main() {
	port := flag.Int("port", 8100, "HTTP port (all addresses)")
	blockSize := flag.Int("block-size", 4, "tokens per block (the engines' and llm-d's)")
	model := flag.String("model", "cluster", "the model name in /dump's key")
	flag.Parse()

	log.SetLogger(zap.New())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = log.IntoContext(ctx, log.Log)
	rt, err := newRouter(ctx, *blockSize, *model)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rt.pool.Start(ctx)
	srv := &http.Server{Addr: net.JoinHostPort("", strconv.Itoa(*port)), Handler: rt.mux(),
		ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "llmd-router:", err)
		os.Exit(1)
	}
	rt.subs.Shutdown(context.Background())
	rt.pool.Shutdown(context.Background())
}
