-- Run by the postgres image's entrypoint once, when the data volume is empty
-- (mounted into /docker-entrypoint-initdb.d by docker-compose.yml). The
-- programs create their tables themselves at start: payment-service migrates
-- "payments", fake-gateway "gateway", shipping-service "shipping" and
-- fake-carrier "carrier" (created last: the health check waits for it).
CREATE DATABASE payments;
CREATE DATABASE gateway;
CREATE DATABASE shipping;
CREATE DATABASE carrier;
