"""``python -m dev demo``: the whole system on a real local plane, told as five short stories, with a final report.

It brings up the plane (etcd, kube-apiserver, kwok, kube-scheduler, redis, the resolver webhook), starts a dispatcher
and K workers, creates fake nodes, and runs, one after another:

1. throughput: a mix of CPU and GPU pods on CPU nodes in two pools and 8-GPU nodes (pods bound and pending, pods/s,
   ledger conflicts retried, pods per worker and why a worker placed few, why pods wait);
2. gangs: a gang held with ``GangIncomplete`` until its last member exists, then bound all together; a second gang
   that cannot fit binds nothing (not even the member that would fit) and starts once the first one leaves;
3. GPU packing: the same 1/2/4-GPU pods on two identical sets of 8-GPU nodes, under the ``gpu`` policy and under
   the spreading ``default`` policy: whole GPU nodes left free and GPUs stranded, then one 8-GPU job on each;
4. pools: a tenant's pods (label ``hoss.io/pool``) land only on their pool's nodes;
5. a foreign scheduler: kube-scheduler and hoss aim pods created together at the same few small nodes; the resolver
   denies the loser's conflicting bindings (counted by the apiserver), and no node is oversold.

Each story's nodes carry a taint its pods tolerate (and a label they select), so the stories do not mix. Oversold
nodes are counted from the apiserver alone (every bound pod's requests against its node's allocatable). The plane
and the hoss processes keep running afterwards, for ``python -m dev status``, the dashboard and kubectl.

Modules: `dev.demo.run` (the demo from start to end), `dev.demo.stage` (its namespaces, nodes, pods and workers),
`dev.demo.observe` (what it reads back from the apiserver, the dispatcher and the resolver), one module per story
under `dev.demo.stories`, `dev.demo.report` (the report's figures) and `dev.demo.printing` (the report as text).
"""
