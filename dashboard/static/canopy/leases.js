// The leases page: live leases' time left ticks (common.js's [data-ttl]).
import { startTicking } from "./common.js";

startTicking();
