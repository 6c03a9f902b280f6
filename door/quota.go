package door

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// CheckIngestQuota refuses a batch that would take the Caller's tenant
// past its tier's ingestion quota (documents and stored bytes across its
// own kbs). It runs while the batch holds an ingestion permit, so batches
// racing past it are at most ingest.max_concurrent; and it counts the
// batch by its title, text and metadata, which its chunks' overlap makes
// a little smaller than what is stored.
func (d *Door) CheckIngestQuota(ctx context.Context, who Caller, kb kbref.Ref, docs []ingest.Document) error {
	tier, _ := d.policy.Current().Tier(who.Tier)
	quota := tier.IngestQuota
	if quota.Documents == 0 && quota.Bytes == 0 {
		return nil
	}
	used, err := d.tenantUsage(ctx, who.Tenant)
	if err != nil {
		d.logger.Error("read the tenant's ingestion usage", "tenant", who.Tenant, "err", err)
		return refusal.Unreachable("could not check the ingestion quota; please retry")
	}
	added, err := d.newDocuments(ctx, kb, docs)
	if err != nil {
		d.logger.Error("read the kb's documents", "kb", kb, "err", err)
		return refusal.Unreachable("could not check the ingestion quota; please retry")
	}
	var bytes int64
	for _, d := range docs {
		bytes += d.Bytes()
	}
	switch {
	case quota.Documents > 0 && used.Documents+added > quota.Documents:
		return quotaExceeded(fmt.Sprintf("%d documents stored and %d new ones would pass the plan's %d", used.Documents, added, quota.Documents))
	case quota.Bytes > 0 && used.Bytes+bytes > quota.Bytes:
		return quotaExceeded(fmt.Sprintf("%d bytes stored and about %d more would pass the plan's %d", used.Bytes, bytes, quota.Bytes))
	}
	return nil
}

func quotaExceeded(detail string) *refusal.Error {
	return &refusal.Error{Class: refusal.Forbidden, Code: "ingest_quota_exceeded",
		Message: "Your organisation's knowledge bases are full: " + detail + ". Delete documents or ask for a larger plan."}
}

// tenantUsage adds up what the tenant's own kbs store.
func (d *Door) tenantUsage(ctx context.Context, tenant string) (kbstore.Usage, error) {
	names, err := d.kbStore.KBs(ctx, tenant)
	if err != nil {
		return kbstore.Usage{}, err
	}
	var total kbstore.Usage
	for _, name := range names {
		u, err := d.kbStore.Usage(ctx, kbref.Ref{Tenant: tenant, Name: name}.Key())
		if err != nil {
			return kbstore.Usage{}, err
		}
		total.Documents += u.Documents
		total.Bytes += u.Bytes
	}
	return total, nil
}

// newDocuments counts the batch's documents kb does not hold yet: a new
// revision of a stored document takes no more of the quota's count.
func (d *Door) newDocuments(ctx context.Context, kb kbref.Ref, docs []ingest.Document) (int64, error) {
	ids := make([]string, len(docs))
	for i, d := range docs {
		ids[i] = d.ID
	}
	revs, err := d.kbStore.Revs(ctx, kb.Key(), ids)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, r := range revs {
		if r == "" {
			n++
		}
	}
	return n, nil
}

// FileQuota is the bytes the Caller's tier lets its tenant keep in files
// (/v1/files; 0: no limit). The files' store counts what it keeps.
func (d *Door) FileQuota(who Caller) int64 {
	tier, _ := d.policy.Current().Tier(who.Tier)
	return tier.FileQuota.Bytes
}
