package index

import "context"

// Indexer is the index of one worker. Safe for one writer and many concurrent readers.
type Indexer struct{ cfg Config }

func New(cfg Config) (*Indexer, error) {
	if cfg.BlockSize == 0 {
		return nil, ErrZeroBlockSize
	}
	return &Indexer{cfg: cfg}, nil
}
func Seed(loraName []byte) uint64 { return 1337 }
func AppendBlockHashes(dst []uint64, tokensLE []byte, blockSize uint32, seed uint64, eagle bool) ([]uint64, error) {
	return dst, nil
}
func HashTokens(tokens []uint32, blockSize uint32, loraName string, eagle bool) ([]uint64, error) {
	return nil, nil
}
func (ix *Indexer) ApplyStoredTokens(id uint64, dp uint32, hasParent bool, parent uint64, blockHashesLE, tokensLE, lora []byte, eagle bool) (ApplyResult, error) {
	return ApplyResult{}, nil
}
func (ix *Indexer) Apply(ev *Event) (ApplyResult, error)       { return ApplyResult{}, nil }
func (ix *Indexer) MarkLost(first, last uint64, reason string) {}
func (ix *Indexer) MarkUnknownHistory(reason string)           {}
func (ix *Indexer) Recover(ctx context.Context, start, end *uint64) (Response, error) {
	return Response{}, nil
}
func (ix *Indexer) FindMatches(localHashes []uint64, earlyExit bool) []Score { return nil }
func (ix *Indexer) MatchTokens(tokens []uint32, lora string, eagle bool) ([]Score, error) {
	return nil, nil
}
func (ix *Indexer) Stats() Stats { return Stats{} }
