-- The service class each request was served in (request.Classes), so that
-- usage can be summed by class, as a price per class bills it. Rows
-- recorded before it have none ('').
ALTER TABLE usage_records ADD COLUMN service_tier TEXT NOT NULL DEFAULT '';
