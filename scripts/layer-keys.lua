-- wrk script for scripts/bench-layer.sh: GET / with an `x-api-key` header
-- naming one of IDENTITIES identities (default 100,000), picked at random
-- for each request, so consecutive requests hit different identities.
-- The run is bounded by wrk's -d; the script only shapes the requests.
--   IDENTITIES=100000 wrk -t1 -c32 -d3s --latency -s scripts/layer-keys.lua http://127.0.0.1:PORT/
local identities = tonumber(os.getenv("IDENTITIES") or "100000")

function init(args)
    math.randomseed(os.time() + math.floor(os.clock() * 1e6))
end

function request()
    return wrk.format("GET", "/", { ["x-api-key"] = "user-" .. math.random(0, identities - 1) })
end
