package zmqpub

// cutBy returns how many peers p cut for reason (a CutReasons name).
func cutBy(p *Publisher, reason string) uint64 {
	for i, r := range CutReasons {
		if r == reason {
			return p.Stats().PeersCut[i]
		}
	}
	panic("no cut reason " + reason)
}
