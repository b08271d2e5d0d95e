-- wrk script for slidegate's decision service: POST /v1/check, each request
-- for one of IDENTITIES identities (default 100,000), visited in a scrambled
-- order so consecutive requests hit different identities (and shards).
-- The run is bounded by wrk's -d; the script only shapes the requests.
--   wrk -t1 -c64 -d5s --latency -s scripts/check-100k.lua http://127.0.0.1:PORT/v1/check
-- Environment: CHECK_RULE (default "check"), IDENTITIES (default 100000);
-- CHECK_SHAPE=throttlecrab sends throttlecrab-server's POST /throttle body
-- instead, 100 per 60 s, for scripts/bench-http.sh's peer; CHECK_SHAPE=nginx-hook
-- sends what nginx's auth_request sends the forward-auth hook (GET /nginx,
-- the original request named in headers, the identity its API key).
local rule = os.getenv("CHECK_RULE") or "check"
local shape = os.getenv("CHECK_SHAPE") or "slidegate"
local identities = tonumber(os.getenv("IDENTITIES") or "100000")
-- A step coprime with the count walks every identity once per lap.
local step = 7919
while identities % step == 0 do step = step + 2 end
local next_id = 0

function init(args)
    -- Threads start at different places in the lap.
    next_id = math.random(0, identities - 1)
end

function request()
    next_id = (next_id + step) % identities
    if shape == "nginx-hook" then
        return wrk.format("GET", nil, {
            ["X-Original-Method"] = "GET",
            ["X-Original-URI"] = "/api/items?page=2",
            ["X-Forwarded-For"] = "203.0.113.7",
            ["X-Api-Key"] = "user-" .. next_id,
        })
    end
    local body
    if shape == "throttlecrab" then
        body = '{"key":"user-' .. next_id .. '","max_burst":100,"count_per_period":100,"period":60}'
    else
        body = '{"rule":"' .. rule .. '","key":"user-' .. next_id .. '","cost":1}'
    end
    return wrk.format("POST", nil, { ["Content-Type"] = "application/json" }, body)
end
