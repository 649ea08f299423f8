#!/usr/bin/perl

# yarl_charge NAME WEIGHT: a cost known only after the response (bytes sent, a cost the
# upstream reports) is added to the quota's chain in the log phase, without deciding; a
# yarl_check on the same quota limits the next requests. A GET-bandwidth quota of 2 MB/s
# with 1 MB objects requested at 10/s across 2 workers admits about 2 objects per second.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);
use Time::HiRes qw(time sleep);

my $t = Test::Yarl->new();
$t->write_file('object.bin', 'x' x 1_000_000);
$t->write_file('index.html', "hello\n");
$t->write_file('err.html', "not here\n");
$t->write_http_conf(<<'EOF2', workers => 2);
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 200ms;
    error_log %%TESTDIR%%/info.log info;
    server {
        listen 127.0.0.1:%%PORT_8080%% reuseport;
        root %%TESTDIR%%;
        location /object.bin {
            yarl_check bucket_bw;
            yarl_charge bucket_bw $bytes_sent;
        }
        location /cost {
            yarl_charge tokens $upstream_http_x_cost;
            proxy_pass http://127.0.0.1:%%PORT_8081%%/;
        }
        # One value per upstream tried: "0, 6" after the first refused the connection.
        location /next {
            yarl_charge tokens $upstream_response_length;
            proxy_pass http://twoup/;
        }
        location /bad {
            yarl_charge tokens $arg_w;
            alias %%TESTDIR%%/index.html;
        }
        # Charged by the lines of the location a request reached first, where it ends.
        location /t/ {
            yarl_charge tokens 7;
            try_files /nosuch @app;
        }
        location @app { proxy_pass http://127.0.0.1:%%PORT_8081%%; }
        location /e/ {
            yarl_charge tokens 100;
            error_page 404 /err.html;
        }
        location = /err.html { }
        location = /stats { yarl_stats; }
    }
    upstream twoup {
        server 127.0.0.1:%%PORT_8082%% max_fails=0;
        server 127.0.0.1:%%PORT_8081%% backup;
    }
    server {
        listen 127.0.0.1:%%PORT_8081%%;
        root %%TESTDIR%%;
        location / {
            add_header X-Cost 5;
            try_files /index.html =404;
        }
    }
EOF2
$t->run_root('A');
$t->run();
# 2 MB/s, a hard cutoff at one second of it.
$t->put_quota('bucket_bw', 2_000_000, 2_000_000, 2_000_000);
$t->put_quota('tokens', 0.001, 1e9, 1e9);
ok($t->wait_quota($t->port(8080), $_, 5), "$_ fetched") for qw(bucket_bw tokens);

my $fill = sub {
	my $s = $t->stats($t->port(8080), "/stats?quota=$_[0]");
	return $s && $s->{quota} ? $s->{quota}{fill} : -1;
};

# Costs from the upstream, and bad weights (counted as 0, logged once).
is(status_of(http_get($t->port(8080), '/cost')), 200, "upstream with a cost $_") for 1 .. 3;
cmp_ok(abs($fill->('tokens') - 15), '<', 0.01, 'X-Cost: 5 charged three times');
is(status_of(http_get($t->port(8080), "/bad?w=$_")), 200, "bad weight $_") for ('abc', '', 'x1');
cmp_ok(abs($fill->('tokens') - 15), '<', 0.01, 'bad weights count 0');
is(status_of(http_get($t->port(8080), '/next')), 200, 'served by the second upstream');
cmp_ok(abs($fill->('tokens') - 21), '<', 0.01, 'the lengths of every upstream tried are summed');

# After `try_files … @app` and after an error page served from another location.
is(status_of(http_get($t->port(8080), '/t/x')), 200, 'try_files to a named location');
cmp_ok(abs($fill->('tokens') - 28), '<', 0.01, 'charged by the first location');
is(status_of(http_get($t->port(8080), '/e/missing')), 404, 'an error page of another location');
cmp_ok(abs($fill->('tokens') - 128), '<', 0.01, 'charged by the first location too');

# 1 MB objects at 10/s for 8 s; admitted per second after 2 s of warm-up.
my @ok;
my $start = time();
for my $n (0 .. 79) {
	my $due = $start + $n * 0.1;
	my $wait = $due - time();
	sleep $wait if $wait > 0;
	my $r = http_get($t->port(8080), '/object.bin');
	push @ok, [time() - $start, status_of($r)];
}
my $warm = grep { $_->[1] == 200 && $_->[0] >= 2 } @ok;
my $secs = $ok[-1][0] - 2;
my $rate = $warm / $secs;
diag(sprintf('admitted %d objects of 1 MB in %.1f s after warm-up: %.2f/s (target 2 ± 0.4)', $warm, $secs, $rate));
cmp_ok(abs($rate - 2), '<=', 0.4, 'a 2 MB/s quota admits 2 objects of 1 MB per second');
my $all = grep { $_->[1] == 200 } @ok;
cmp_ok($all, '<', 80, 'the rest were rejected');

my $log = $t->read_file('info.log');
my $logged = () = $log =~ /yarl: charge weight .* counted as 0/g;
cmp_ok($logged, '>=', 1, 'a bad weight is logged');
cmp_ok($logged, '<=', 2, 'once per worker');
like($log, qr/\[info\].*charge weight "abc" for quota "tokens" is not a number/, 'at info, naming the weight and the quota');

$t->finish();
done_testing();
