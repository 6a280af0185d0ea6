-- Run by the postgres image's entrypoint once, when the data volume is empty
-- (mounted into /docker-entrypoint-initdb.d by docker-compose.yml). The
-- programs create their tables themselves: payment-service migrates "payments"
-- and fake-gateway migrates "gateway" at start.
CREATE DATABASE payments;
CREATE DATABASE gateway;
