"""Scheduling: where work runs: the inventory of nodes and engine clusters, the scheduling pass, persisting its
placements, what it holds back for plans, and the waste read off its snapshot."""
